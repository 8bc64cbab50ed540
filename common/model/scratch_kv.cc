#include "common/model/scratch_kv.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_rows.h"

namespace tandem::model {

ScratchKv::ScratchKv(Model& model, DType kv_dtype, int64_t max_positions)
    : model_(model), layout_(model.config().KvLayoutFor(kv_dtype, 16)) {
  const int64_t blocks = (max_positions + layout_.block_size - 1) / layout_.block_size;
  kv_.resize(blocks * layout_.BlockBytes());
  for (int64_t b = 0; b < blocks; ++b) block_table_.push_back(static_cast<int32_t>(b));
}

void ScratchKv::Clear() { std::fill(kv_.begin(), kv_.end(), 0); }

absl::Status ScratchKv::Forward(const int32_t* tokens, int64_t n, int64_t start, LogitsMode mode,
                                const PruningPlan* plan, ForwardProbe* probe) {
  const int64_t capacity = static_cast<int64_t>(block_table_.size()) * layout_.block_size;
  if (n < 0 || start < 0 || start + n > capacity) {
    return absl::InvalidArgumentError(absl::StrCat("positions ", start, "..", start + n - 1,
                                                   " exceed the scratch cache's ", capacity));
  }
  const ForwardSequence seq{.tokens = tokens,
                            .num_tokens = static_cast<int>(n),
                            .start_pos = start,
                            .block_table = block_table_.data(),
                            .logits = mode};
  return model_.Forward({&seq, 1}, kv_.data(), layout_, logits_, plan, probe);
}

void ScratchKv::Read(int layer, bool value, int head, int64_t pos, float* out) const {
  const uint8_t* block = kv_.data() + (pos / layout_.block_size) * layout_.BlockBytes();
  kv::ReadKvRow(block, layout_, {layer, head, value, static_cast<int>(pos % layout_.block_size)},
                out);
}

void ScratchKv::Zero(const std::vector<uint8_t>& layers, int64_t begin, int64_t end) {
  const size_t row = static_cast<size_t>(layout_.head_dim) * layout_.ElementBytes();
  for (int layer = 0; layer < layout_.num_layers; ++layer) {
    if (!layers[layer]) continue;
    for (int64_t pos = begin; pos < end; ++pos) {
      uint8_t* block = kv_.data() + (pos / layout_.block_size) * layout_.BlockBytes();
      const size_t in_block = (pos % layout_.block_size) * row;
      for (int h = 0; h < layout_.num_kv_heads; ++h) {
        std::memset(block + layout_.KOffset(layer, h) + in_block, 0, row);
        std::memset(block + layout_.VOffset(layer, h) + in_block, 0, row);
      }
    }
  }
}

}  // namespace tandem::model
