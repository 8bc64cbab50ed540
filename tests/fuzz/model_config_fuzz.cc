// libFuzzer target: config.json and generation_config.json parsing, plus the derived values
// the engine computes from an accepted config.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = tandem::model::ModelConfig::FromJson(text, "config.json");
  if (config.ok()) {
    (void)config->ParameterCount();
    (void)config->RopeInvFreq();
    (void)config->KvLayoutFor(tandem::DType::kBF16, 16).BytesPerToken();
    (void)config->MergeGenerationConfig(text, "generation_config.json");
  }
  return 0;
}
