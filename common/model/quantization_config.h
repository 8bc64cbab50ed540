// The `quantization_config` of a Hugging Face config.json: which published format a quantized
// checkpoint's weights are in (GPTQ, AWQ, compressed-tensors int), parsed and checked here so
// that a variant Tandem does not take is refused by name at load, never misread.
//
// ModelWeights::Load reads every configuration this accepts (WeightBinder::Quantized), except
// asymmetric pack-quantized weights, which it refuses by name (planned).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace tandem::model {

struct QuantizationConfig {
  enum class Method { kNone, kGptq, kAwq, kCompressedTensors };
  // How the integers are stored in the checkpoint's tensors.
  enum class Packing {
    kNone,
    kGptq,      // qweight [in/pf, out] packed along the input, qzeros [groups, out/pf], scales
    kAwqGemm,   // qweight [in, out/8], nibbles in the order 0,2,4,6,1,3,5,7
    kCtInt,     // compressed-tensors int-/naive-quantized: weight int8 [out, in], weight_scale
    kCtPacked,  // compressed-tensors pack-quantized: weight_packed int32 [out, in/pf]
  };
  Method method = Method::kNone;
  Packing packing = Packing::kNone;
  int bits = 0;            // 4 or 8
  int group_size = 0;      // input columns per scale; 0: one per output channel
  bool symmetric = true;   // no zero points (or a fixed one)
  bool act_order = false;  // g_idx permutes the input columns (GPTQ desc_act, CT actorder)
  bool gptq_v2 = false;    // GPTQ zeros stored as they are (v1 stores zero - 1)
  bool lm_head = false;    // lm_head is quantized too
  bool int8_activations = false;  // W8A8: activations quantized per token, dynamically
  std::vector<std::string> ignore;  // modules left unquantized (names, or "re:" patterns)

  bool quantized() const { return method != Method::kNone; }
  // "gptq-w4-g128-sym", "awq-w4-g64", "ct-w8a8-channel", ... ; "none" when not quantized.
  std::string Name() const;
};

// `config` is the whole config.json object; its `quantization_config` absent or null is no
// quantization. InvalidArgument naming `source`, the key (quantization_config.<field>) and the
// value for a malformed field or a variant Tandem does not take.
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const nlohmann::json& config,
                                                           std::string_view source);

}  // namespace tandem::model
