#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tools/make_random_model/model_spec.h"

namespace tandem::make_random_model {

// Splits `tensors` (in order) into `shards` non-empty contiguous groups of roughly equal bytes.
// Returns the shard index of every tensor.
absl::StatusOr<std::vector<int>> AssignShards(const std::vector<TensorSpec>& tensors, int shards);

// Writes config.json, generation_config.json and the weights (model.safetensors, or
// model-0000k-of-0000N.safetensors plus model.safetensors.index.json when shards > 1) into
// `dir`, creating it and removing weight files a previous run left there.
absl::Status WriteModelDir(const ModelSpec& spec, const std::string& dir, int shards);

}  // namespace tandem::make_random_model
