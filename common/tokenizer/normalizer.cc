#include "common/tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/pattern.h"
#include "common/util/utf8.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(int options) : options_(options) {}
  std::string Normalize(std::string text) const override {
    // Pure ASCII is invariant under every normalization form.
    bool ascii = true;
    for (char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii || text.empty()) return text;
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                      static_cast<utf8proc_ssize_t>(text.size()), &out,
                                      static_cast<utf8proc_option_t>(options_ | UTF8PROC_STABLE));
    if (n < 0) return text;  // Unreachable for validated input; keep the text unchanged.
    std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return result;
  }

 private:
  int options_;
};

class Lowercase : public Normalizer {
 public:
  std::string Normalize(std::string text) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      AppendUtf8(static_cast<char32_t>(utf8proc_tolower(DecodeUtf8(text, &pos))), &out);
    }
    return out;
  }
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class Replace : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string text) const override {
    return ReplaceAll(pattern_, text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string text) const override {
    auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
    size_t b = 0, e = text.size();
    while (left_ && b < e && is_space(text[b])) ++b;
    while (right_ && e > b && is_space(text[e - 1])) --e;
    return text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string Normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->Normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> ParseSequence(const json& j,
                                                          const std::string& source) {
  auto it = j.find("normalizers");
  if (it == j.end() || !it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"normalizers\" must be a list"));
  }
  std::vector<std::unique_ptr<Normalizer>> steps;
  for (size_t i = 0; i < it->size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(
        auto step, ParseNormalizer((*it)[i], absl::StrCat(source, ".normalizers[", i, "]")));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return std::make_unique<SequenceNormalizer>(std::move(steps));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const json& j,
                                                            const std::string& source) {
  if (j.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(std::string type, TypeOf(j, source));
  JsonFields f(j, source);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  }
  if (type == "NFKD") {
    return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  }
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "Sequence") return ParseSequence(j, source);
  if (type == "Prepend") {
    TANDEM_ASSIGN_OR_RETURN(std::string prefix, f.String("prepend"));
    return std::make_unique<Prepend>(std::move(prefix));
  }
  if (type == "Replace") {
    if (!j.contains("pattern")) return f.Error("pattern", "is missing");
    TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::Parse(j["pattern"], source));
    TANDEM_ASSIGN_OR_RETURN(std::string content, f.String("content"));
    return std::make_unique<Replace>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    TANDEM_ASSIGN_OR_RETURN(bool left, f.BoolOr("strip_left", true));
    TANDEM_ASSIGN_OR_RETURN(bool right, f.BoolOr("strip_right", true));
    return std::make_unique<Strip>(left, right);
  }
  return absl::UnimplementedError(absl::StrCat(
      source, ": normalizer type \"", type,
      "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence)"));
}

}  // namespace tandem::tokenizer
