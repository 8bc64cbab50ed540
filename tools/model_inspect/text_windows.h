// Windows of a text for model-inspect's evaluations (prune-eval, importance, kv-eval): each is a
// prompt and the tokens that follow it in the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/cli_args.h"

namespace tandem::tools {

inline constexpr int64_t kMaxWindowTokens = int64_t{1} << 20;

struct Window {
  std::vector<int32_t> prompt;        // BOS (when the model has one) and the window's first tokens
  std::vector<int32_t> continuation;  // the tokens that follow in the text
  int64_t continuation_bytes = 0;     // UTF-8 bytes of the continuation's text
};

// --prompt-tokens, --continuation-tokens and --windows (8), with the command's defaults.
struct WindowFlags {
  int64_t prompt_tokens = 0, continuation_tokens = 0, windows = 0;
};
absl::StatusOr<WindowFlags> ParseWindowFlags(const CliArgs& args, int64_t prompt_tokens,
                                             int64_t continuation_tokens);

// Consecutive, non-overlapping windows of the text's tokens.
absl::StatusOr<std::vector<Window>> CutWindows(const tokenizer::Tokenizer& tok,
                                               const std::string& text, int prompt_tokens,
                                               int continuation_tokens, int max_windows);

// Index of the largest of n logits (the first, on ties).
int32_t Argmax(const float* logits, int64_t n);

}  // namespace tandem::tools
