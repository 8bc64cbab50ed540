// libFuzzer target: tokenizer.json loading (the fuzzed bytes are the file), then a short
// encode/decode round with whatever tokenizer was accepted.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto tok = tandem::tokenizer::Tokenizer::FromJson(text, "", "tokenizer.json");
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello world! 123 \xC3\xA9\xE6\x97\xA5 <s>  \t\n", true);
  if (ids.ok()) (void)(*tok)->Decode(*ids, false);
  return 0;
}
