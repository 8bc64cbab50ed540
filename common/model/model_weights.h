#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/backend_factory.h"
#include "common/kernels/cpu/gemm.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/util/huge_page_arena.h"

namespace tandem::model {

// Weights of one decoder layer. Matrices keep their stored dtype (memory-mapped, or packed into
// panels in huge pages: see WeightMemory); the small vectors (norms, biases) are converted to
// f32 once at load time.
struct LayerWeights {
  std::vector<float> input_norm;
  kernels::WeightMatrix q_proj, k_proj, v_proj, o_proj;
  std::vector<float> q_bias, k_bias, v_bias;  // empty unless config.attention_bias
  std::vector<float> q_norm, k_norm;          // [head_dim], Qwen3 only
  std::vector<float> post_attention_norm;
  kernels::WeightMatrix gate_proj, up_proj, down_proj;
};

// Where the large matrices live once loaded.
enum class WeightMemory {
  kMmap,  // zero-copy views of the memory-mapped files (shared page cache, fast start)
  // Copied into anonymous 2 MiB-page memory (fewer TLB misses), packed on the way into the
  // GEMM's panel layout (kernels::WeightLayout::kPanels): no per-call packing, faster decode
  // and prefill, and results that do not depend on the batch size.
  kHugePages,
};

struct WeightLoadOptions {
  WeightMemory memory = WeightMemory::kMmap;
  ThreadPool* pool = nullptr;  // packs kHugePages weights in parallel; null: the calling thread
  // Where the model computes (model.device). A device backend reads row-major weights, so
  // kHugePages (the CPU GEMM's panels) is for the CPU only.
  kernels::DeviceSpec device{};
};

absl::StatusOr<WeightMemory> ParseWeightMemory(std::string_view name);

// All weights of a model directory, validated against its config: every expected tensor present
// with the right shape and a float dtype, no unexpected tensors. Owns the mappings.
class ModelWeights {
 public:
  // Loads DIR/model.safetensors or the shards listed in DIR/model.safetensors.index.json.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const std::string& dir,
                                                            const ModelConfig& config,
                                                            const WeightLoadOptions& options = {});

  kernels::WeightMatrix embed_tokens;
  kernels::WeightMatrix lm_head;  // equals embed_tokens when embeddings are tied
  std::vector<float> final_norm;
  std::vector<LayerWeights> layers;
  DType dtype = DType::kBF16;  // dtype of the large matrices (the embedding's)
  int64_t total_bytes = 0;     // bytes of all tensors used

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // Copies of tensors whose mapped bytes are not aligned to their element size.
  std::vector<std::unique_ptr<uint8_t[]>> realigned_;
  std::unique_ptr<HugePageArena> arena_;  // kHugePages only
  friend class WeightBinder;
};

}  // namespace tandem::model
