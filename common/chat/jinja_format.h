// Values as text the way Python writes them: str() for {{ output }}, repr() inside containers,
// and json.dumps as transformers' `tojson` filter calls it (ensure_ascii=False, insertion order).
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"

namespace tandem::chat {

// Bounds on formatting nested or self-referencing values.
struct FormatLimits {
  int max_depth = 256;
  size_t max_bytes = 16 << 20;
};

std::string IntToString(Int i);
// repr(float): shortest round-trip digits, "1.0", "1e+16", "inf", "nan".
std::string FloatRepr(double f);

// str(v) appended to *out: undefined is "", None is "None", containers as their repr.
absl::Status AppendStr(const Value& v, const FormatLimits& limits, std::string* out);
absl::StatusOr<std::string> ToStr(const Value& v, const FormatLimits& limits);
// repr(v).
absl::Status AppendRepr(const Value& v, const FormatLimits& limits, std::string* out);
// Python's repr of a str: quotes chosen as Python does, non-printables escaped.
void AppendStringRepr(const std::string& s, std::string* out);

struct JsonOptions {
  bool indent = false;  // pretty-print with `indent_str` per level
  std::string indent_str;
  bool ensure_ascii = false;
  bool sort_keys = false;
  std::string item_separator = ", ";  // ",\n" is implied when indenting
  std::string key_separator = ": ";
};
// json.dumps(v, ...).
absl::Status AppendJson(const Value& v, const JsonOptions& options, const FormatLimits& limits,
                        std::string* out);

}  // namespace tandem::chat
