// libFuzzer target: security.api_keys_file parsing, and the Authorization header checked against
// the keys an accepted file holds. Input: the file, then a NUL and the header.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "common/security/api_keys.h"
#include "tests/fuzz/fuzz_temp_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view file = input.substr(0, nul);
  const std::string_view header = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  auto parsed = tandem::security::ParseApiKeys(file, {.max_concurrent = 1});
  if (!parsed.ok() || header.empty()) return 0;
  static const std::string path = tandem::fuzzing::TempDir() + "/api_keys";
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return 0;
  std::fwrite(file.data(), 1, file.size(), f);
  std::fclose(f);
  auto keys = tandem::security::ApiKeys::Load(path, {.max_concurrent = 1}, nullptr);
  if (!keys.ok()) __builtin_trap();  // what parsed must load
  auto lease = (*keys)->Admit(header, "/fuzz");
  if (lease.ok() && (*lease)->name().empty()) __builtin_trap();
  return 0;
}
