#include "common/util/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {

bool JsonFields::Has(std::string_view key) const { return object_.contains(key); }

bool JsonFields::HasValue(std::string_view key) const {
  auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

absl::Status JsonFields::Error(std::string_view key, std::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(source_, ": key \"", std::string(key), "\" ", std::string(what)));
}

absl::StatusOr<int64_t> JsonFields::Int(std::string_view key, int64_t min, int64_t max) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return Error(key, "is missing");
  int64_t v;
  if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::nearbyint(it->get<double>()) == it->get<double>() &&
             std::fabs(it->get<double>()) < 9e15) {
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return Error(key, absl::StrCat("must be an integer, got ", it->dump()));
  }
  if (v < min || v > max) {
    return Error(key,
                 absl::StrCat("is ", v, ", outside the accepted range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<int64_t> JsonFields::IntOr(std::string_view key, int64_t fallback, int64_t min,
                                          int64_t max) const {
  if (!HasValue(key)) return fallback;
  return Int(key, min, max);
}

absl::StatusOr<double> JsonFields::Number(std::string_view key, double min, double max) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return Error(key, "is missing");
  if (!it->is_number()) return Error(key, absl::StrCat("must be a number, got ", it->dump()));
  double v = it->get<double>();
  if (!std::isfinite(v) || v < min || v > max) {
    return Error(key,
                 absl::StrCat("is ", v, ", outside the accepted range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<double> JsonFields::NumberOr(std::string_view key, double fallback, double min,
                                            double max) const {
  if (!HasValue(key)) return fallback;
  return Number(key, min, max);
}

absl::StatusOr<bool> JsonFields::BoolOr(std::string_view key, bool fallback) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Error(key, absl::StrCat("must be true or false, got ", it->dump()));
  return it->get<bool>();
}

absl::StatusOr<std::string> JsonFields::String(std::string_view key) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return Error(key, "is missing");
  if (!it->is_string()) return Error(key, absl::StrCat("must be a string, got ", it->dump()));
  return it->get<std::string>();
}

absl::StatusOr<std::string> JsonFields::StringOr(std::string_view key,
                                                 std::string_view fallback) const {
  if (!HasValue(key)) return std::string(fallback);
  return String(key);
}

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": not valid JSON"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": top-level JSON value must be an object"));
  }
  return j;
}

}  // namespace tandem
