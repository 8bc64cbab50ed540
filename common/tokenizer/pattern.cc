#include "common/tokenizer/pattern.h"

#include "absl/strings/str_cat.h"

namespace tandem::tokenizer {

absl::Status RequireObject(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": must be a JSON object, got ", j.dump().substr(0, 80)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TypeOf(const nlohmann::json& j, const std::string& source) {
  if (auto s = RequireObject(j, source); !s.ok()) return s;
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"type\" must be a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<Pattern> Pattern::Parse(const nlohmann::json& j, const std::string& source) {
  std::string where = absl::StrCat(source, " pattern");
  if (auto s = RequireObject(j, where); !s.ok()) return s;
  Pattern p;
  if (auto it = j.find("String"); it != j.end() && it->is_string()) {
    p.literal_ = it->get<std::string>();
    if (p.literal_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"String\" must not be empty"));
    }
    return p;
  }
  if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
    auto regex = Regex::Compile(it->get<std::string>(), where);
    if (!regex.ok()) return regex.status();
    p.regex_ = std::move(regex).value();
    return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": needs a string \"String\" or \"Regex\" key"));
}

std::vector<Span> Pattern::FindAll(std::string_view text) const {
  if (regex_ != nullptr) return regex_->FindAll(text);
  std::vector<Span> spans;
  size_t pos = 0;
  while ((pos = text.find(literal_, pos)) != std::string_view::npos) {
    spans.push_back({pos, pos + literal_.size()});
    pos += literal_.size();
  }
  return spans;
}

std::string ReplaceAll(const Pattern& pattern, std::string_view text, std::string_view content) {
  std::vector<Span> spans = pattern.FindAll(text);
  if (spans.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + spans.size() * content.size());
  size_t last = 0;
  for (const Span& s : spans) {
    out.append(text.substr(last, s.begin - last));
    out.append(content);
    last = s.end;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace tandem::tokenizer
