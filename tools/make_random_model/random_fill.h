#pragma once

#include <cstdint>
#include <string_view>

#include "tools/make_random_model/model_spec.h"

namespace tandem::make_random_model {

// Values are generated in blocks of this many elements, each from its own PRNG stream seeded
// by (model seed, tensor name, block index), so the output does not depend on how blocks are
// split across threads or files.
inline constexpr int64_t kFillBlock = 1 << 16;

// Seed of the tensor called `name` in a model generated with `model_seed`.
uint64_t TensorSeed(uint64_t model_seed, std::string_view name);

// Writes elements [first_block * kFillBlock, + n) of a tensor with init `kind` to `out`.
void FillBlocks(InitKind kind, double std, uint64_t tensor_seed, int64_t first_block, int64_t n,
                float* out);

}  // namespace tandem::make_random_model
