#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/cli_args.h"

namespace tandem::tools {

absl::Status RunInfo(const CliArgs& args);
absl::Status RunKvCache(const CliArgs& args);
absl::Status RunForward(const CliArgs& args);
absl::Status RunGenerate(const CliArgs& args);
absl::Status RunTokenize(const CliArgs& args);
absl::Status RunDetokenize(const CliArgs& args);

// A generate prompt from --tokens, or from --prompt encoded with the model's tokenizer (BOS
// as its config says); the tokenizer is kept to decode the output.
struct PromptTokens {
  std::vector<int32_t> ids;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;  // Null for --tokens.
};
absl::StatusOr<PromptTokens> ResolvePrompt(const CliArgs& args);
// Prints the generated ids comma-separated on one line, then (with --prompt) their text.
absl::Status PrintGenerated(const std::vector<int32_t>& ids, const PromptTokens& prompt);

}  // namespace tandem::tools
