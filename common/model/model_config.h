#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"
#include "common/model/quantization_config.h"
#include "common/util/dtype.h"

namespace tandem::model {

// The Llama-family architectures Tandem runs. They share one forward pass and differ in
// q/k/v biases (Qwen2) and per-head RMSNorm of q and k before RoPE (Qwen3).
enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

std::string_view ArchitectureName(Architecture arch);

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

// The parts of a Hugging Face config.json (+ generation_config.json) the engine needs.
struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written in config.json, e.g. "LlamaForCausalLM"
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t max_position_embeddings = 0;
  // Mistral-style sliding window; 0 = none. Tandem clamps the context to it instead of
  // implementing windowed attention (identical results within the window).
  int64_t sliding_window = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases (Qwen2 always; Llama when attention_bias=true)
  bool qk_norm = false;         // Qwen3
  DType torch_dtype = DType::kBF16;
  // config.json's quantization_config: the published format of quantized weights (none for a
  // float checkpoint). Loading quantized weights is planned; ModelWeights::Load refuses them.
  QuantizationConfig quantization;
  int32_t bos_token_id = -1;  // -1 = none
  std::vector<int32_t> eos_token_ids;

  // Parses config.json text; `source` names the file in error messages.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json_text, std::string_view source);
  // Reads DIR/config.json and, if present, DIR/generation_config.json (for EOS/BOS ids).
  static absl::StatusOr<ModelConfig> FromDirectory(const std::string& dir);
  // Merges a generation_config.json (EOS ids, BOS id) into this config.
  absl::Status MergeGenerationConfig(std::string_view json_text, std::string_view source);

  // Longest sequence (prompt + generated) the model accepts.
  int64_t ContextLength() const;
  int64_t ParameterCount() const;
  kv::KvLayout KvLayoutFor(DType kv_dtype, int block_size) const;
  // Per-pair rotary frequencies (head_dim/2 values) with rope_scaling applied.
  std::vector<float> RopeInvFreq() const;
  bool IsEos(int32_t token) const;
};

}  // namespace tandem::model
