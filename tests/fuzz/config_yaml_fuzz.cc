// libFuzzer target: the YAML configuration parser and `--set` overrides. An accepted config
// must print as YAML that parses back to the same config.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = tandem::config::ParseConfig(text, "fuzz.yaml");
  if (config.ok()) {
    const std::string yaml = tandem::config::ToYaml(*config);
    auto again = tandem::config::ParseConfig(yaml, "roundtrip.yaml");
    if (!again.ok() || tandem::config::ToYaml(*again) != yaml) std::abort();
  }
  tandem::config::TandemConfig c;
  (void)tandem::config::ApplyOverride(c, text);
  return 0;
}
