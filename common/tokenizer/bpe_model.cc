#include "common/tokenizer/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/pattern.h"
#include "common/util/utf8.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

constexpr int64_t kMaxVocab = 1 << 24;
// Longer words are rare and would only churn the cache.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

// The last UTF-8 character of `s` (s non-empty).
std::string_view LastChar(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return s.substr(i);
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Parse(const json& j,
                                                          const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(std::string type, TypeOf(j, source));
  if (type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat(source, ": model type \"", type, "\" is not supported (BPE)"));
  }
  JsonFields f(j, source);
  std::unique_ptr<BpeModel> m(new BpeModel());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    TANDEM_ASSIGN_OR_RETURN(std::string v, f.StringOr(key, ""));
    if (!v.empty()) return f.Error(key, "is not supported when non-empty");
  }
  TANDEM_ASSIGN_OR_RETURN(m->byte_fallback_, f.BoolOr("byte_fallback", false));
  TANDEM_ASSIGN_OR_RETURN(m->ignore_merges_, f.BoolOr("ignore_merges", false));
  TANDEM_ASSIGN_OR_RETURN(m->fuse_unk_, f.BoolOr("fuse_unk", false));
  if (!j.contains("vocab")) return f.Error("vocab", "is missing");
  TANDEM_RETURN_IF_ERROR(m->ParseVocab(j["vocab"], source));
  if (!j.contains("merges")) return f.Error("merges", "is missing");
  TANDEM_RETURN_IF_ERROR(m->ParseMerges(j["merges"], source));
  if (f.HasValue("unk_token")) {
    TANDEM_ASSIGN_OR_RETURN(std::string unk, f.String("unk_token"));
    m->unk_id_ = m->TokenToId(unk);
    if (m->unk_id_ < 0) return f.Error("unk_token", "names a token that is not in the vocab");
  }
  m->metaspace_split_ = m->TokenToId(kMetaspace) >= 0;
  for (int b = 0; b < 256; ++b) m->byte_ids_[b] = m->TokenToId(absl::StrFormat("<0x%02X>", b));
  return m;
}

absl::Status BpeModel::ParseVocab(const json& vocab, const std::string& source) {
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"vocab\" must be an object"));
  }
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kMaxVocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": vocab entry \"", token, "\" must be an integer id in [0, ", kMaxVocab, ")"));
    }
    if (auto s = ValidateUtf8(token); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": vocab key: ", s.message()));
    }
    auto id = static_cast<int32_t>(value.get<int64_t>());
    vocab_[token] = id;
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id] : vocab_) id_to_token_[id] = token;
  return absl::OkStatus();
}

absl::Status BpeModel::ParseMerges(const json& merges, const std::string& source) {
  if (!merges.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"merges\" must be a list"));
  }
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    auto rank = static_cast<int32_t>(i);
    if (m.is_string()) {
      // "a b": tokens cannot contain a space in this form, so the first space separates them.
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": merges[", i, "] \"", s, "\" must be two tokens separated by one space"));
      }
      TANDEM_RETURN_IF_ERROR(AddMerge(std::string_view(s).substr(0, space),
                                      std::string_view(s).substr(space + 1), rank, source));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      TANDEM_RETURN_IF_ERROR(AddMerge(m[0].get_ref<const std::string&>(),
                                      m[1].get_ref<const std::string&>(), rank, source));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": merges[", i, "] must be \"a b\" or [\"a\", \"b\"], got ", m.dump()));
    }
  }
  return absl::OkStatus();
}

absl::Status BpeModel::AddMerge(std::string_view left, std::string_view right, int32_t rank,
                                const std::string& source) {
  int32_t l = TokenToId(left);
  int32_t r = TokenToId(right);
  int32_t merged = TokenToId(absl::StrCat(AbslView(left), AbslView(right)));
  if (l < 0 || r < 0 || merged < 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": merge \"", AbslView(left), "\" + \"",
                                                   AbslView(right),
                                                   "\" uses a token that is not in the vocab"));
  }
  if (right.starts_with(kMetaspace) && !left.ends_with(kMetaspace)) {
    joins_metaspace_after_.insert(std::string(LastChar(left)));
  }
  // The first occurrence of a pair has the best rank; later duplicates are ignored.
  merges_.try_emplace(PairKey(l, r), Merge{rank, merged});
  return absl::OkStatus();
}

int32_t BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(AbslView(token));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::IdToToken(int32_t id) const {
  static const std::string* empty = new std::string();
  if (id < 0 || id >= vocab_size()) return *empty;
  return id_to_token_[id];
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* ids) const {
  size_t pos = 0;
  bool prev_unk = false;
  while (pos < word.size()) {
    size_t len = std::min(Utf8LeadLength(static_cast<unsigned char>(word[pos])), word.size() - pos);
    int32_t id = TokenToId(word.substr(pos, len));
    if (id >= 0) {
      ids->push_back(id);
      prev_unk = false;
    } else if (byte_fallback_ && byte_ids_[static_cast<unsigned char>(word[pos])] >= 0) {
      for (size_t i = 0; i < len; ++i) {
        ids->push_back(byte_ids_[static_cast<unsigned char>(word[pos + i])]);
      }
      prev_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(fuse_unk_ && prev_unk)) ids->push_back(unk_id_);
      prev_unk = true;
    }
    pos += len;
  }
}

void BpeModel::MergeSymbols(std::vector<int32_t>* ids) const {
  const int n = static_cast<int>(ids->size());
  if (n < 2) return;
  std::vector<int32_t>& id = *ids;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(id[pos], id[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, id[pos], id[next[pos]]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    // Stale entries: either side changed since the pair was queued (ids only grow longer,
    // so equal ids mean the same symbols).
    int right = next[c.pos];
    if (id[c.pos] != c.left || right < 0 || id[right] != c.right) continue;
    id[c.pos] = merges_.find(PairKey(c.left, c.right))->second.new_id;
    id[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t out = 0;
  for (int i = 0; i >= 0; i = next[i]) id[out++] = id[i];
  id.resize(out);
}

bool BpeModel::CanSplitBefore(std::string_view word, size_t pos) const {
  std::string_view prev = LastChar(word.substr(0, pos));
  return prev != kMetaspace &&
         !joins_metaspace_after_.contains(absl::string_view(prev.data(), prev.size()));
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (int32_t id = TokenToId(word); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  if (!metaspace_split_) return EncodeWord(word, out);
  // Cutting is exact: merges never cross a cut, and BPE inside each piece is independent of
  // the others, so the ids equal those of the uncut word.
  size_t start = 0;
  for (size_t pos = word.find(kMetaspace, 1); pos != std::string_view::npos;
       pos = word.find(kMetaspace, pos + kMetaspace.size())) {
    if (!CanSplitBefore(word, pos)) continue;
    EncodeWord(word.substr(start, pos - start), out);
    start = pos;
  }
  EncodeWord(word.substr(start), out);
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable && cache_.Lookup(word, out)) return;
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  InitialSymbols(word, &ids);
  MergeSymbols(&ids);
  if (cacheable) cache_.Insert(word, ids.data(), ids.size());
  out->insert(out->end(), ids.begin(), ids.end());
}

}  // namespace tandem::tokenizer
