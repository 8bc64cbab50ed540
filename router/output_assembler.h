// Turns the token stream of one request into what the client sees: token ids plus text deltas
// that hold only whole UTF-8 characters, cut before the first stop string. Text that could be
// the start of a stop string is held back until it cannot be.
//
// One instance per request; not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem::router {

class OutputAssembler {
 public:
  // `tokenizer` may be null (ids-only model): every text delta is then empty.
  OutputAssembler(const tokenizer::Tokenizer* tokenizer, std::vector<std::string> stop);

  struct Delta {
    std::vector<int32_t> token_ids;
    std::string text;
    bool stopped = false;  // a stop string matched; nothing more is accepted
  };
  // Tokens after a stop match are dropped (the match ends the request).
  absl::StatusOr<Delta> Add(std::span<const int32_t> tokens);
  // End of stream without a stop match: text still held back.
  std::string Flush();

  bool stopped() const { return stopped_; }
  int num_tokens() const { return num_tokens_; }

 private:
  // Moves `pending_` into `out` except a tail that may begin a stop string.
  void Release(std::string& out);

  std::optional<tokenizer::IncrementalDetokenizer> detokenizer_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded, not yet sent
  bool stopped_ = false;
  int num_tokens_ = 0;
};

}  // namespace tandem::router
