#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

// Typed, bounded access to the fields of a JSON object, for parsers of files users hand us.
// Every error names the source file and the key, so a person can fix the file.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string_view source)
      : object_(object), source_(source) {}

  bool Has(std::string_view key) const;
  // Present and not null.
  bool HasValue(std::string_view key) const;
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t min, int64_t max) const;
  absl::StatusOr<int64_t> IntOr(std::string_view key, int64_t fallback, int64_t min,
                                int64_t max) const;
  absl::StatusOr<double> Number(std::string_view key, double min, double max) const;
  absl::StatusOr<double> NumberOr(std::string_view key, double fallback, double min,
                                  double max) const;
  absl::StatusOr<bool> BoolOr(std::string_view key, bool fallback) const;
  absl::StatusOr<std::string> String(std::string_view key) const;
  absl::StatusOr<std::string> StringOr(std::string_view key, std::string_view fallback) const;

  absl::Status Error(std::string_view key, std::string_view what) const;

 private:
  const nlohmann::json& object_;
  std::string source_;
};

// Parses JSON text without exceptions; InvalidArgument naming `source` on bad syntax or a
// top-level value that is not an object.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view source);

}  // namespace tandem
