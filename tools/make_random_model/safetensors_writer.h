#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/util/dtype.h"
#include "tools/make_random_model/model_spec.h"

namespace tandem::make_random_model {

// Produces elements [first_block * kFillBlock, + n) of `tensor` as floats. Called from several
// threads at once for disjoint ranges.
using TensorSource =
    std::function<void(const TensorSpec& tensor, int64_t first_block, int64_t n, float* out)>;

// The bytes before the tensor data: 8-byte little-endian header length, then the JSON header
// padded with spaces so that the data starts 8-byte aligned. Tensors are laid out in order.
std::string SafetensorsHeader(const std::vector<const TensorSpec*>& tensors, DType dtype);

// Streams `tensors` into a safetensors file at `path`, a bounded chunk at a time, converting
// to `dtype`. Returns the number of tensor data bytes written.
absl::StatusOr<int64_t> WriteSafetensors(const std::string& path,
                                         const std::vector<const TensorSpec*>& tensors, DType dtype,
                                         const TensorSource& source);

}  // namespace tandem::make_random_model
