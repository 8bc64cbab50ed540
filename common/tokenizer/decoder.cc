#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pattern.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

class ByteLevelDecoder : public Decoder {
 public:
  void Decode(std::vector<std::string>* tokens) const override {
    const ByteLevelTable& table = ByteLevelTable::Get();
    for (auto& t : *tokens) t = table.Decode(t);
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Decode(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) t = ReplaceAll(pattern_, t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xNN>" -> the byte NN; other tokens are untouched.
class ByteFallbackDecoder : public Decoder {
 public:
  void Decode(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') continue;
      int value = 0;
      bool ok = true;
      for (int i = 3; i < 5; ++i) {
        char c = t[i];
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        ok &= digit >= 0;
        value = value * 16 + digit;
      }
      if (ok) t = std::string(1, static_cast<char>(value));
    }
  }
};

class FuseDecoder : public Decoder {
 public:
  void Decode(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void Decode(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      for (int i = 0; i < start_ && t.starts_with(content_); ++i) t.erase(0, content_.size());
      for (int i = 0; i < stop_ && t.ends_with(content_); ++i) {
        t.resize(t.size() - content_.size());
      }
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void Decode(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string out;
      std::string_view t = (*tokens)[i];
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.substr(pos).starts_with(replacement_)) {
          out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      if (i == 0 && strip_first_ && out.starts_with(' ')) out.erase(0, 1);
      (*tokens)[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void Decode(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->Decode(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

absl::StatusOr<std::unique_ptr<Decoder>> ParseSequence(const json& j, const std::string& source) {
  auto it = j.find("decoders");
  if (it == j.end() || !it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"decoders\" must be a list"));
  }
  std::vector<std::unique_ptr<Decoder>> steps;
  for (size_t i = 0; i < it->size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(auto step,
                            ParseDecoder((*it)[i], absl::StrCat(source, ".decoders[", i, "]")));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return std::make_unique<SequenceDecoder>(std::move(steps));
}

absl::StatusOr<std::unique_ptr<Decoder>> ParseMetaspace(const JsonFields& f) {
  TANDEM_ASSIGN_OR_RETURN(std::string replacement, f.StringOr("replacement", "\xE2\x96\x81"));
  if (replacement.empty()) return f.Error("replacement", "must not be empty");
  bool strip_first = true;
  if (f.HasValue("prepend_scheme")) {
    TANDEM_ASSIGN_OR_RETURN(std::string scheme, f.String("prepend_scheme"));
    strip_first = scheme != "never";
  } else {
    TANDEM_ASSIGN_OR_RETURN(strip_first, f.BoolOr("add_prefix_space", true));
  }
  return std::make_unique<MetaspaceDecoder>(std::move(replacement), strip_first);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const json& j, const std::string& source) {
  if (j.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(std::string type, TypeOf(j, source));
  JsonFields f(j, source);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Sequence") return ParseSequence(j, source);
  if (type == "Metaspace") return ParseMetaspace(f);
  if (type == "Replace") {
    if (!j.contains("pattern")) return f.Error("pattern", "is missing");
    TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::Parse(j["pattern"], source));
    TANDEM_ASSIGN_OR_RETURN(std::string content, f.String("content"));
    return std::make_unique<ReplaceDecoder>(std::move(pattern), std::move(content));
  }
  if (type == "Strip") {
    TANDEM_ASSIGN_OR_RETURN(std::string content, f.String("content"));
    if (content.empty()) return f.Error("content", "must not be empty");
    TANDEM_ASSIGN_OR_RETURN(int64_t start, f.IntOr("start", 0, 0, 1 << 20));
    TANDEM_ASSIGN_OR_RETURN(int64_t stop, f.IntOr("stop", 0, 0, 1 << 20));
    return std::make_unique<StripDecoder>(std::move(content), static_cast<int>(start),
                                          static_cast<int>(stop));
  }
  return absl::UnimplementedError(absl::StrCat(
      source, ": decoder type \"", type,
      "\" is not supported (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence)"));
}

}  // namespace tandem::tokenizer
