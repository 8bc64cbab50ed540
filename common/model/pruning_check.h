#pragma once

// POP's attention-stability check (the seed article's runtime monitor): how closely a pruned
// prefill's attention, as the first decode step sees it, follows a full prefill's.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/util/dtype.h"

namespace tandem::model {

// Cosine similarity of two float vectors: 1 when both are zero, 0 when one is.
double CosineSimilarity(const float* a, const float* b, int64_t n);

// The full-depth positions of `prompt` prefilled alone under `settings`: the last one (POP's
// boundary handling) and those of the protected ids (BOS and EOS not counted).
std::vector<uint8_t> PromptFullDepth(std::span<const int32_t> prompt,
                                     const PruningSettings& settings, const ModelConfig& config);

struct LayerSimilarity {
  int layer = 0;
  double cosine = 0;  // of the last prompt token's attention output (o_proj), pruned vs full
};

// Prefills `prompt` twice into scratch memory of `kv_dtype`, in pieces of at most `chunk_size`
// tokens (as an engine would; it bounds the model's workspace), with every layer and pruned per
// `settings`, and returns the similarity for each pruned layer, in layer order. Costs two
// prefills of the prompt and a KV cache of its length. What a pruned batch does to the prompt:
// min_batch_size is not consulted. `run_chunk`, if set, runs each piece's forward pass (given as
// a callable), e.g. on a turn of a shared compute pool, so that other engines step between them.
using ChunkRunner = std::function<absl::Status(const std::function<absl::Status()>& forward)>;
absl::StatusOr<std::vector<LayerSimilarity>> CheckAttentionStability(
    Model& model, std::span<const int32_t> prompt, const PruningSettings& settings, DType kv_dtype,
    int chunk_size = 512, const ChunkRunner& run_chunk = nullptr);

}  // namespace tandem::model
