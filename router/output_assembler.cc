#include "router/output_assembler.h"

#include <algorithm>

namespace tandem::router {

OutputAssembler::OutputAssembler(const tokenizer::Tokenizer* tokenizer,
                                 std::vector<std::string> stop)
    : stop_(std::move(stop)) {
  if (tokenizer != nullptr) detokenizer_.emplace(*tokenizer, /*skip_special_tokens=*/true);
}

absl::StatusOr<OutputAssembler::Delta> OutputAssembler::Add(std::span<const int32_t> tokens) {
  Delta delta;
  for (int32_t id : tokens) {
    if (stopped_) break;
    delta.token_ids.push_back(id);
    ++num_tokens_;
    if (!detokenizer_.has_value()) continue;
    absl::StatusOr<std::string> text = detokenizer_->Add(id);
    if (!text.ok()) return text.status();
    pending_ += *text;
    // The earliest match wins; only text that could contain a new match is searched.
    size_t cut = std::string::npos;
    for (const std::string& s : stop_) cut = std::min(cut, pending_.find(s));
    if (cut != std::string::npos) {
      delta.text += pending_.substr(0, cut);
      pending_.clear();
      stopped_ = true;
    }
  }
  if (!stopped_) Release(delta.text);
  delta.stopped = stopped_;
  return delta;
}

std::string OutputAssembler::Flush() {
  if (stopped_ || !detokenizer_.has_value()) return "";
  std::string out = std::move(pending_);
  pending_.clear();
  out += detokenizer_->Flush();
  for (const std::string& s : stop_) {
    const size_t cut = out.find(s);
    if (cut != std::string::npos) out.resize(cut);
  }
  return out;
}

void OutputAssembler::Release(std::string& out) {
  // Longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stop_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  out += pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
}

}  // namespace tandem::router
