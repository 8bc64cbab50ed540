#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/util/dtype.h"
#include "nlohmann/json.hpp"

namespace tandem::make_random_model {

enum class Arch { kLlama, kMistral, kQwen2, kQwen3 };

absl::StatusOr<Arch> ParseArch(std::string_view name);
std::string_view ArchModelType(Arch arch);  // "llama", "mistral", ...

// Llama-3 style frequency-dependent RoPE scaling ("rope_type": "llama3").
struct Llama3RopeScaling {
  double factor = 32.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Everything that decides the shape, config and weights of a generated model.
struct ModelSpec {
  Arch arch = Arch::kLlama;
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 0;  // 0: hidden / heads.
  int64_t ffn = 128;
  int64_t vocab = 256;
  int64_t max_pos = 2048;
  double rope_theta = 10000.0;
  bool rope_scaling_llama3 = false;
  Llama3RopeScaling rope_scaling;
  bool tie_embeddings = false;
  DType dtype = DType::kF32;
  double rms_eps = 1e-5;
  int64_t bos_id = 1;
  int64_t eos_id = 2;
  double init_std = 0.0;  // 0: kDefaultInitGain / sqrt(hidden).
  uint64_t seed = 0;

  int64_t HeadDim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  double InitStd() const;
};

// With weights ~N(0, g/sqrt(hidden)) and RMS-normalized inputs, every projection output has
// std ~g, so logits have std ~g and attention scores std ~g^2: 1.5 keeps greedy choices away
// from ties and attention neither uniform nor one-hot.
inline constexpr double kDefaultInitGain = 1.5;
// Norm weights are 1 + kNormNoise * N(0,1); biases kBiasStd * N(0,1).
inline constexpr double kNormNoise = 0.1;
inline constexpr double kBiasStd = 0.2;

// Defaults of `preset` ("tiny", "125m", "1b") for `arch`.
absl::StatusOr<ModelSpec> PresetSpec(Arch arch, std::string_view preset);

absl::Status ValidateSpec(const ModelSpec& spec);

// config.json and generation_config.json as Hugging Face writes them for the architecture
// (keys sorted, as transformers' to_json_string does).
nlohmann::json ConfigJson(const ModelSpec& spec);
nlohmann::json GenerationConfigJson(const ModelSpec& spec);

enum class InitKind {
  kMatrix,  // N(0, init_std)
  kNorm,    // 1 + noise
  kBias,    // small N(0, kBiasStd)
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  InitKind init = InitKind::kMatrix;

  int64_t NumElements() const;
};

// All weights of the model in Hugging Face state-dict order.
std::vector<TensorSpec> TensorList(const ModelSpec& spec);

}  // namespace tandem::make_random_model
