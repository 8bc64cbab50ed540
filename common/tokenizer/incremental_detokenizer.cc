#include "common/tokenizer/incremental_detokenizer.h"

#include "absl/types/span.h"
#include "common/util/utf8.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {
namespace {

constexpr size_t kMaxWindow = 64;

}  // namespace

absl::StatusOr<std::string> IncrementalDetokenizer::Add(int32_t id) {
  ids_.push_back(id);
  absl::Span<const int32_t> all(ids_);
  TANDEM_ASSIGN_OR_RETURN(
      std::string base,
      tokenizer_.DecodeBytes(all.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                             skip_special_tokens_));
  auto full = tokenizer_.DecodeBytes(all.subspan(prefix_offset_), skip_special_tokens_);
  if (!full.ok()) {
    ids_.pop_back();  // A bad id leaves the stream as it was.
    return full.status();
  }
  // Decoders only append as tokens are added, so the window's text extends `base`.
  size_t start = std::min(full->size(), base.size() + emitted_);
  std::string_view fresh = std::string_view(*full).substr(start);
  size_t hold = IncompleteUtf8Suffix(fresh);
  // Output that keeps ending mid-character would grow the window without bound (quadratic
  // work); past a window no real character needs, the held bytes are given up as U+FFFD.
  if (hold > 0 && ids_.size() - prefix_offset_ > kMaxWindow) hold = 0;
  std::string out = ToValidUtf8(fresh.substr(0, fresh.size() - hold));
  pending_ = std::string(fresh.substr(fresh.size() - hold));
  if (hold == 0) {
    // Everything up to here is out: slide the window forward to keep each step short.
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
    emitted_ = 0;
  } else {
    emitted_ += fresh.size() - hold;
  }
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = pending_.empty() ? "" : ToValidUtf8(pending_);
  pending_.clear();
  prefix_offset_ = read_offset_ = ids_.size();
  emitted_ = 0;
  return out;
}

}  // namespace tandem::tokenizer
