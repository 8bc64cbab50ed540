// libFuzzer target: the safetensors header parser must reject any byte string cleanly.
#include <cstddef>
#include <cstdint>

#include "common/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t data_start = 0;
  auto tensors = tandem::model::ParseSafetensorsHeader(data, size, "fuzz.safetensors", &data_start);
  if (tensors.ok()) {
    // Every accepted entry must lie inside the input.
    for (const auto& t : *tensors) {
      if (data_start + t.end > size || t.begin > t.end) __builtin_trap();
    }
  }
  return 0;
}
