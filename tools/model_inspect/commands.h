#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/cli_args.h"

namespace tandem::tools {

absl::Status RunInfo(const CliArgs& args);
absl::Status RunKvCache(const CliArgs& args);
absl::Status RunForward(const CliArgs& args);
absl::Status RunGenerate(const CliArgs& args);
absl::Status RunTokenize(const CliArgs& args);
absl::Status RunDetokenize(const CliArgs& args);
absl::Status RunPruneEval(const CliArgs& args);
absl::Status RunPruningStats(const CliArgs& args);  // --kv-cache --pruning-stats
absl::Status RunImportance(const CliArgs& args);
absl::Status RunKvEval(const CliArgs& args);
absl::Status RunQuantize(const CliArgs& args);

// Shared flag handling of the commands that run a model.
absl::StatusOr<std::unique_ptr<ThreadPool>> MakePool(const CliArgs& args);  // --threads
// --kv-dtype; "auto" means the model's own dtype, as Hugging Face stores KV in it.
// "mixed" gives the dtype of a mixed cache's wide blocks (fp16).
absl::StatusOr<DType> KvDType(const CliArgs& args, const model::ModelConfig& c);
// --kv-dtype mixed with --kv-sink-tokens and --kv-window-tokens (defaults as kv_cache.mixed);
// not enabled for any other --kv-dtype.
absl::StatusOr<engine::EngineOptions::MixedKv> MixedKvFromFlags(const CliArgs& args);
absl::StatusOr<std::unique_ptr<model::Model>> LoadModel(const CliArgs& args, ThreadPool& pool);
// --prune-start-layer | --prune-ratio, --prune-keep-every, --protect-tokens; false when no
// pruning is asked for.
absl::StatusOr<bool> PruningFromFlags(const CliArgs& args, int num_layers,
                                      model::PruningSettings* settings);

// --evict-budget-tokens (0: off), --evict-sink-tokens, --evict-policy sliding|semantic,
// --evict-shift-threshold: kv_cache.eviction's settings.
absl::StatusOr<kv::EvictionPolicy> EvictionFromFlags(const CliArgs& args);

// What an evaluation over a text file loads: the text, the model of --model (on a pool of
// --threads, in --weight-memory) and its tokenizer.
struct TextEvalInputs {
  std::string text;
  std::string dir;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<ThreadPool> pool;  // before the model, which runs on it
  std::unique_ptr<model::Model> model;
};
absl::StatusOr<TextEvalInputs> LoadTextEval(const CliArgs& args, const std::string& text_path);

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
