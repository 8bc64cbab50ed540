#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

// A tokenizer.json "decoder": turns token strings back into text. Works on raw bytes (a
// ByteFallback or ByteLevel token may hold part of a UTF-8 character), so callers decide how
// to treat incomplete sequences. Supported: ByteLevel, Metaspace, ByteFallback, Fuse, Strip,
// Replace, Sequence. Immutable after parsing, so shareable between threads.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void Decode(std::vector<std::string>* tokens) const = 0;
};

// Null JSON gives nullptr (tokens are concatenated). Unknown types are Unimplemented.
absl::StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& j,
                                                      const std::string& source);

}  // namespace tandem::tokenizer
