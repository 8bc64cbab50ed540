#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::tokenizer {

// A tokenizer.json "normalizer": rewrites text (valid UTF-8 in, valid UTF-8 out) before
// pre-tokenization. Supported: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Prepend, Replace,
// Strip and Sequence. Immutable after parsing, so shareable between threads.
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string Normalize(std::string text) const = 0;
};

// Null JSON gives nullptr (no normalization). Unknown types are Unimplemented naming `source`.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& j,
                                                            const std::string& source);

}  // namespace tandem::tokenizer
