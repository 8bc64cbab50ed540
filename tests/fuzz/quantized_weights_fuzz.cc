// libFuzzer target: loading a quantized checkpoint (GPTQ, AWQ, compressed-tensors) from any
// bytes. The first byte picks the config.json (a tiny Llama with one of the quantization
// configs below); the rest is the model.safetensors file. The loader must refuse anything
// malformed with a status: wrong shapes or dtypes, out-of-range g_idx, bad weight_shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/util/file_util.h"
#include "tests/fuzz/fuzz_temp_dir.h"

namespace {

constexpr const char* kQuantization[] = {
    R"({"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": false, "sym": true})",
    R"({"quant_method": "gptq", "bits": 8, "group_size": 16, "desc_act": true, "sym": false,
        "checkpoint_format": "gptq_v2"})",
    R"({"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": true,
        "version": "gemm"})",
    R"({"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8,
        "type": "int", "symmetric": false, "strategy": "group", "group_size": 16},
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
        "dynamic": true, "symmetric": true}}}})",
    R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
        "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4,
        "type": "int", "symmetric": true, "strategy": "channel", "actorder": "group"}}}})",
};

std::string Config(size_t which) {
  return std::string(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 32,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": true, "quantization_config": )") +
         kQuantization[which] + "}";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t which = data[0] % (sizeof(kQuantization) / sizeof(kQuantization[0]));
  const std::string& dir = tandem::fuzzing::TempDir();
  if (!tandem::WriteStringToFile(dir + "/config.json", Config(which)).ok()) std::abort();
  const std::string_view weights(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!tandem::WriteStringToFile(dir + "/model.safetensors", weights).ok()) std::abort();
  auto config = tandem::model::ModelConfig::FromDirectory(dir);
  if (!config.ok()) std::abort();  // the configs above are valid
  auto weights_or = tandem::model::ModelWeights::Load(dir, *config);
  (void)weights_or;
  return 0;
}
