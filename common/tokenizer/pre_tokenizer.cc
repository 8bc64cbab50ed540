#include "common/tokenizer/pre_tokenizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pattern.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

// GPT-2's word regex, used by ByteLevel when use_regex is set.
constexpr char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kMetaspace[] = "\xE2\x96\x81";  // U+2581

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Segment {
  Span span;
  bool is_match;
};

// Applies HF's SplitDelimiterBehavior to the matched and unmatched segments of one piece.
std::vector<Span> ApplyBehavior(const std::vector<Segment>& segs, Behavior behavior) {
  std::vector<Span> out;
  bool prev_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const auto& s : segs) {
        if (!s.is_match) out.push_back(s.span);
      }
      break;
    case Behavior::kIsolated:
      for (const auto& s : segs) out.push_back(s.span);
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& s : segs) {
        if (s.is_match && !prev_match && !out.empty()) {
          out.back().end = s.span.end;
        } else {
          out.push_back(s.span);
        }
        prev_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !prev_match && !out.empty()) {
          out.back().begin = it->span.begin;
        } else {
          out.push_back(it->span);
        }
        prev_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case Behavior::kContiguous:
      for (size_t i = 0; i < segs.size(); ++i) {
        if (i > 0 && segs[i].is_match == segs[i - 1].is_match) {
          out.back().end = segs[i].span.end;
        } else {
          out.push_back(segs[i].span);
        }
      }
      break;
  }
  return out;
}

void SplitPieces(const Pattern& pattern, Behavior behavior, bool invert,
                 std::vector<std::string>* pieces) {
  std::vector<std::string> result;
  result.reserve(pieces->size());
  std::vector<Segment> segs;
  for (std::string& piece : *pieces) {
    std::vector<Span> matches = pattern.FindAll(piece);
    if (matches.empty() && !invert && behavior != Behavior::kRemoved) {
      result.push_back(std::move(piece));  // Common case for short words: no copy.
      continue;
    }
    segs.clear();
    size_t last = 0;
    for (const Span& m : matches) {
      if (m.begin > last) segs.push_back({{last, m.begin}, invert});
      segs.push_back({m, !invert});
      last = m.end;
    }
    if (last < piece.size()) segs.push_back({{last, piece.size()}, invert});
    for (const Span& s : ApplyBehavior(segs, behavior)) {
      if (s.end > s.begin) result.push_back(piece.substr(s.begin, s.end - s.begin));
    }
  }
  *pieces = std::move(result);
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<std::string>* pieces, bool) const override {
    SplitPieces(pattern_, behavior_, invert_, pieces);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<std::string>* pieces, bool) const override {
    if (add_prefix_space_) {
      for (auto& p : *pieces) {
        if (!p.empty() && p[0] != ' ') p.insert(p.begin(), ' ');
      }
    }
    if (regex_ != nullptr) SplitPieces(*regex_, Behavior::kIsolated, false, pieces);
    const ByteLevelTable& table = ByteLevelTable::Get();
    std::string mapped;
    for (auto& p : *pieces) {
      mapped.clear();
      table.EncodeAppend(p, &mapped);
      p.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void PreTokenize(std::vector<std::string>* pieces, bool first_section) const override {
    std::vector<std::string> result;
    for (size_t i = 0; i < pieces->size(); ++i) {
      std::string p;
      for (char c : (*pieces)[i]) {
        if (c == ' ') {
          p += replacement_;
        } else {
          p.push_back(c);
        }
      }
      bool prepend = scheme_ == PrependScheme::kAlways ||
                     (scheme_ == PrependScheme::kFirst && first_section && i == 0);
      if (prepend && !p.starts_with(replacement_)) p.insert(0, replacement_);
      if (!split_) {
        result.push_back(std::move(p));
        continue;
      }
      // Each word starts at a replacement character (MergedWithNext).
      size_t start = 0;
      size_t pos = p.find(replacement_, 1);
      while (pos != std::string::npos) {
        result.push_back(p.substr(start, pos - start));
        start = pos;
        pos = p.find(replacement_, pos + replacement_.size());
      }
      if (start < p.size()) result.push_back(p.substr(start));
    }
    *pieces = std::move(result);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<std::string>* pieces, bool first_section) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces, first_section);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

absl::StatusOr<Behavior> ParseBehavior(const JsonFields& f) {
  TANDEM_ASSIGN_OR_RETURN(std::string name, f.StringOr("behavior", "Isolated"));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return f.Error("behavior", absl::StrCat("has unknown value \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> RegexSplit(const std::string& regex,
                                                         Behavior behavior, bool invert,
                                                         const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(Pattern p, Pattern::Parse(json{{"Regex", regex}}, source));
  return std::make_unique<SplitPreTokenizer>(std::move(p), behavior, invert);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseMetaspace(const json& j,
                                                             const std::string& source) {
  JsonFields f(j, source);
  TANDEM_ASSIGN_OR_RETURN(std::string replacement, f.StringOr("replacement", kMetaspace));
  if (replacement.empty()) return f.Error("replacement", "must not be empty");
  PrependScheme scheme = PrependScheme::kAlways;
  if (f.HasValue("prepend_scheme")) {
    TANDEM_ASSIGN_OR_RETURN(std::string name, f.String("prepend_scheme"));
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else {
      return f.Error("prepend_scheme", "must be \"always\", \"first\" or \"never\"");
    }
  } else {
    TANDEM_ASSIGN_OR_RETURN(bool add, f.BoolOr("add_prefix_space", true));
    scheme = add ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  TANDEM_ASSIGN_OR_RETURN(bool split, f.BoolOr("split", true));
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme, split);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParseSequence(const json& j,
                                                            const std::string& source) {
  auto it = j.find("pretokenizers");
  if (it == j.end() || !it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"pretokenizers\" must be a list"));
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  for (size_t i = 0; i < it->size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(
        auto step, ParsePreTokenizer((*it)[i], absl::StrCat(source, ".pretokenizers[", i, "]")));
    if (step != nullptr) steps.push_back(std::move(step));
  }
  return std::make_unique<SequencePreTokenizer>(std::move(steps));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const json& j,
                                                                const std::string& source) {
  if (j.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(std::string type, TypeOf(j, source));
  JsonFields f(j, source);
  if (type == "Sequence") return ParseSequence(j, source);
  if (type == "Metaspace") return ParseMetaspace(j, source);
  if (type == "Split") {
    if (!j.contains("pattern")) return f.Error("pattern", "is missing");
    TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::Parse(j["pattern"], source));
    TANDEM_ASSIGN_OR_RETURN(Behavior behavior, ParseBehavior(f));
    TANDEM_ASSIGN_OR_RETURN(bool invert, f.BoolOr("invert", false));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  if (type == "ByteLevel") {
    TANDEM_ASSIGN_OR_RETURN(bool add_prefix_space, f.BoolOr("add_prefix_space", true));
    TANDEM_ASSIGN_OR_RETURN(bool use_regex, f.BoolOr("use_regex", true));
    std::unique_ptr<Pattern> regex;
    if (use_regex) {
      TANDEM_ASSIGN_OR_RETURN(Pattern p, Pattern::Parse(json{{"Regex", kGpt2Regex}}, source));
      regex = std::make_unique<Pattern>(std::move(p));
    }
    return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
  }
  if (type == "Digits") {
    TANDEM_ASSIGN_OR_RETURN(bool individual, f.BoolOr("individual_digits", false));
    return RegexSplit(individual ? R"(\p{N})" : R"(\p{N}+)", Behavior::kIsolated, false, source);
  }
  if (type == "Whitespace") return RegexSplit(R"(\w+|[^\w\s]+)", Behavior::kRemoved, true, source);
  if (type == "WhitespaceSplit") return RegexSplit(R"(\s+)", Behavior::kRemoved, false, source);
  return absl::UnimplementedError(
      absl::StrCat(source, ": pre_tokenizer type \"", type,
                   "\" is not supported (Split, ByteLevel, Metaspace, Digits, Whitespace, "
                   "WhitespaceSplit, Sequence)"));
}

}  // namespace tandem::tokenizer
