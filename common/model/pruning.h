#pragma once

// Prefill-only layer pruning (POP, arXiv 2602.03295): which layers a prefill skips and which of
// its tokens still run every layer. The forward pass itself is Model::Forward with a PruningPlan.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::model {

// The seed's settings. Layer numbers are 0-based, as in Hugging Face weight names
// (`model.layers.N`): start_layer 10 of a 16-layer model prunes layers 10..15.
struct PruningSettings {
  int start_layer = 0;
  // Of the pruned range, every keep_every-th layer (start + k - 1, start + 2k - 1, ...) runs at
  // full depth; 0 keeps none.
  int keep_every = 0;
  // Positions holding the N most frequent token ids of the prompt run at full depth.
  int protected_tokens = 0;
};

// The start layer that prunes the last `ratio` (0..1) of num_layers layers, rounded to the
// nearest layer: 1/3 of 16 layers prunes 5 (start 11).
int StartLayerForRatio(double ratio, int num_layers);

// Settings from a config or flags: pruning starts at `start_layer`, or, when `ratio` > 0, prunes
// the last `ratio` of the layers (StartLayerForRatio). InvalidArgument when both are given, when
// a value is out of range, or when the start is past the model's last layer (it would prune
// nothing; a 1-based start_layer of the last layer is the usual cause).
absl::StatusOr<PruningSettings> ResolvePruningSettings(int start_layer, double ratio,
                                                       int keep_every, int protected_tokens,
                                                       int num_layers);

// One entry per layer, 1 where the layer is pruned.
std::vector<uint8_t> PrunedLayers(const PruningSettings& settings, int num_layers);

// Sets full_depth[i] (one entry per prompt token) for every position whose id is among the `n`
// most frequent ids of `prompt`. Ids in `excluded` (BOS, EOS) are not counted; ties go to the id
// seen first.
void MarkProtectedTokens(std::span<const int32_t> prompt, int n,
                         std::span<const int32_t> excluded, std::span<uint8_t> full_depth);

}  // namespace tandem::model
