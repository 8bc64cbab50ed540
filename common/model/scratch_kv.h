#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/kv/kv_layout.h"
#include "common/model/model.h"
#include "common/util/dtype.h"

namespace tandem::model {

// A KV cache for one sequence in a plain buffer (block table 0, 1, 2, ...), for diagnostics that
// run a model outside an engine: model-inspect's pruning tools and the prefill worker's
// attention-stability check. Zero-filled when made.
class ScratchKv {
 public:
  ScratchKv(Model& model, DType kv_dtype, int64_t max_positions);

  void Clear();
  const kv::KvLayout& layout() const { return layout_; }
  // The logits of the last Forward call.
  const std::vector<float>& logits() const { return logits_; }

  // `n` tokens at positions start.. (Model::Forward for one sequence).
  absl::Status Forward(const int32_t* tokens, int64_t n, int64_t start, LogitsMode mode,
                       const PruningPlan* plan, ForwardProbe* probe = nullptr);
  // K (`value` false) or V of one head at one position, as head_dim floats.
  void Read(int layer, bool value, int head, int64_t pos, float* out) const;
  // Zeroes K and V of positions begin..end-1 in the layers marked in `layers`.
  void Zero(const std::vector<uint8_t>& layers, int64_t begin, int64_t end);

 private:
  Model& model_;
  const kv::KvLayout layout_;
  std::vector<uint8_t> kv_;
  std::vector<int32_t> block_table_;
  std::vector<float> logits_;
};

}  // namespace tandem::model
