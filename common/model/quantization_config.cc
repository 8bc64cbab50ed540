#include "common/model/quantization_config.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

using json = nlohmann::json;
using Method = QuantizationConfig::Method;
using Packing = QuantizationConfig::Packing;

// The fields of one JSON object under quantization_config, errors naming the full key.
class Section {
 public:
  Section(const json& object, const std::string& source, std::string path)
      : object_(object), fields_(object, source), source_(source), path_(std::move(path)) {}

  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": key \"", path_, ".", key, "\" ", what));
  }
  // A field's failure, renamed to its full key.
  template <typename T>
  absl::StatusOr<T> Named(absl::StatusOr<T> v, const std::string& key) const {
    if (v.ok()) return v;
    const std::string message(v.status().message());
    const std::string bare = absl::StrCat("key \"", key, "\" ");
    const size_t at = message.find(bare);
    return Error(key, at == std::string::npos ? message : message.substr(at + bare.size()));
  }
  absl::StatusOr<int64_t> IntOr(const std::string& key, int64_t fallback, int64_t lo,
                                int64_t hi) const {
    return Named(fields_.IntOr(key, fallback, lo, hi), key);
  }
  absl::StatusOr<bool> BoolOr(const std::string& key, bool fallback) const {
    return Named(fields_.BoolOr(key, fallback), key);
  }
  absl::StatusOr<std::string> StringOr(const std::string& key, const std::string& fallback) const {
    return Named(fields_.StringOr(key, fallback), key);
  }
  bool HasValue(const std::string& key) const { return fields_.HasValue(key); }
  const json& at(const std::string& key) const { return object_.at(std::string(key)); }
  // A field that must be absent, null or empty: Tandem has nothing that reads it.
  absl::Status Unsupported(const std::string& key, const std::string& why) const {
    if (!HasValue(key)) return absl::OkStatus();
    const json& v = at(key);
    if ((v.is_object() || v.is_array()) && v.empty()) return absl::OkStatus();
    return Error(key, absl::StrCat("is ", v.dump(), ": ", why));
  }
  absl::StatusOr<std::vector<std::string>> Strings(const std::string& key) const {
    std::vector<std::string> out;
    if (!HasValue(key)) return out;
    const json& v = at(key);
    if (!v.is_array()) return Error(key, "must be a list of strings");
    for (const json& s : v) {
      if (!s.is_string()) return Error(key, "must be a list of strings");
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  const std::string& path() const { return path_; }
  const std::string& source() const { return source_; }

 private:
  const json& object_;
  JsonFields fields_;
  std::string source_;
  std::string path_;
};

absl::Status ParseGptq(const Section& q, QuantizationConfig& c) {
  c.packing = Packing::kGptq;
  TANDEM_ASSIGN_OR_RETURN(int64_t bits, q.IntOr("bits", 4, 1, 64));
  if (bits != 4 && bits != 8) return q.Error("bits", absl::StrCat("is ", bits, "; GPTQ 4 or 8"));
  c.bits = static_cast<int>(bits);
  TANDEM_ASSIGN_OR_RETURN(int64_t group, q.IntOr("group_size", 128, -1, 1 << 20));
  if (group == 0) return q.Error("group_size", "is 0; -1 (one group per row) or > 0");
  c.group_size = group < 0 ? 0 : static_cast<int>(group);
  TANDEM_ASSIGN_OR_RETURN(c.act_order, q.BoolOr("desc_act", false));
  TANDEM_ASSIGN_OR_RETURN(c.symmetric, q.BoolOr("sym", true));
  TANDEM_ASSIGN_OR_RETURN(c.lm_head, q.BoolOr("lm_head", false));
  TANDEM_ASSIGN_OR_RETURN(std::string format, q.StringOr("checkpoint_format", "gptq"));
  if (format != "gptq" && format != "gptq_v2") {
    return q.Error("checkpoint_format",
                   absl::StrCat("is \"", format, "\"; gptq or gptq_v2 (repacked formats such as "
                                "marlin are not read)"));
  }
  c.gptq_v2 = format == "gptq_v2";
  return q.Unsupported("dynamic", "per-module overrides are not supported");
}

absl::Status ParseAwq(const Section& q, QuantizationConfig& c) {
  c.packing = Packing::kAwqGemm;
  const char* bits_key = q.HasValue("w_bit") ? "w_bit" : "bits";
  TANDEM_ASSIGN_OR_RETURN(int64_t bits, q.IntOr(bits_key, 4, 1, 64));
  if (bits != 4) return q.Error(bits_key, absl::StrCat("is ", bits, "; AWQ is 4-bit"));
  c.bits = 4;
  const char* group_key = q.HasValue("q_group_size") ? "q_group_size" : "group_size";
  TANDEM_ASSIGN_OR_RETURN(int64_t group, q.IntOr(group_key, 128, 1, 1 << 20));
  c.group_size = static_cast<int>(group);
  TANDEM_ASSIGN_OR_RETURN(bool zero_point, q.BoolOr("zero_point", true));
  if (!zero_point) return q.Error("zero_point", "is false; AWQ with zero points only");
  c.symmetric = false;
  TANDEM_ASSIGN_OR_RETURN(std::string version, q.StringOr("version", "gemm"));
  std::transform(version.begin(), version.end(), version.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (version != "gemm") {
    return q.Error("version", absl::StrCat("is \"", version, "\"; the GEMM packing only"));
  }
  TANDEM_ASSIGN_OR_RETURN(c.ignore, q.Strings("modules_to_not_convert"));
  return absl::OkStatus();
}

// One scheme of config_groups: the weights (and the activations, for W8A8).
absl::Status ParseScheme(const Section& group, QuantizationConfig& c) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<std::string> targets, group.Strings("targets"));
  if (std::find(targets.begin(), targets.end(), "Linear") == targets.end()) {
    return group.Error("targets", "must include \"Linear\"");
  }
  if (!group.HasValue("weights") || !group.at("weights").is_object()) {
    return group.Error("weights", "is missing; weight quantization is what is read");
  }
  const Section w(group.at("weights"), group.source(), group.path() + ".weights");
  TANDEM_ASSIGN_OR_RETURN(int64_t bits, w.IntOr("num_bits", 8, 1, 64));
  if (bits != 4 && bits != 8) return w.Error("num_bits", absl::StrCat("is ", bits, "; 4 or 8"));
  c.bits = static_cast<int>(bits);
  TANDEM_ASSIGN_OR_RETURN(std::string type, w.StringOr("type", "int"));
  if (type != "int") {
    return w.Error("type", absl::StrCat("is \"", type, "\"; integer weights only"));
  }
  TANDEM_ASSIGN_OR_RETURN(c.symmetric, w.BoolOr("symmetric", true));
  TANDEM_ASSIGN_OR_RETURN(bool dynamic, w.BoolOr("dynamic", false));
  if (dynamic) return w.Error("dynamic", "is true; weights have static scales");
  TANDEM_ASSIGN_OR_RETURN(std::string strategy, w.StringOr("strategy", "channel"));
  if (strategy == "group") {
    TANDEM_ASSIGN_OR_RETURN(int64_t gs, w.IntOr("group_size", 0, 1, 1 << 20));
    if (gs == 0) return w.Error("group_size", "is missing; strategy group needs it");
    c.group_size = static_cast<int>(gs);
  } else if (strategy != "channel") {
    return w.Error("strategy", absl::StrCat("is \"", strategy, "\"; channel or group"));
  }
  if (w.HasValue("actorder")) {
    const json& a = w.at("actorder");
    if (!a.is_string() || (a != "group" && a != "weight")) {
      return w.Error("actorder", absl::StrCat("is ", a.dump(), "; null, \"group\" or \"weight\""));
    }
    c.act_order = true;
  }
  if (group.HasValue("input_activations")) {
    const Section a(group.at("input_activations"), group.source(),
                    group.path() + ".input_activations");
    TANDEM_ASSIGN_OR_RETURN(int64_t abits, a.IntOr("num_bits", 8, 1, 64));
    TANDEM_ASSIGN_OR_RETURN(std::string atype, a.StringOr("type", "int"));
    TANDEM_ASSIGN_OR_RETURN(std::string astrategy, a.StringOr("strategy", "token"));
    TANDEM_ASSIGN_OR_RETURN(bool adynamic, a.BoolOr("dynamic", true));
    TANDEM_ASSIGN_OR_RETURN(bool asym, a.BoolOr("symmetric", true));
    if (abits != 8 || atype != "int" || astrategy != "token" || !adynamic || !asym) {
      return group.Error("input_activations",
                         absl::StrCat("is ", group.at("input_activations").dump(),
                                      "; activations: int8, symmetric, per token, dynamic "
                                      "(a static input_scale is not supported)"));
    }
    if (c.bits != 8) return w.Error("num_bits", "must be 8 with int8 activations (W8A8)");
    c.int8_activations = true;
  }
  return group.Unsupported("output_activations", "output quantization is not supported");
}

absl::Status ParseCompressedTensors(const Section& q, QuantizationConfig& c) {
  TANDEM_ASSIGN_OR_RETURN(std::string format, q.StringOr("format", ""));
  if (format == "int-quantized" || format == "naive-quantized") {
    c.packing = Packing::kCtInt;
  } else if (format == "pack-quantized") {
    c.packing = Packing::kCtPacked;
  } else {
    return q.Error("format", absl::StrCat("is \"", format,
                                          "\"; int-quantized, naive-quantized or pack-quantized"));
  }
  for (const char* key : {"sparsity_config", "transform_config", "kv_cache_scheme"}) {
    TANDEM_RETURN_IF_ERROR(q.Unsupported(key, "not supported"));
  }
  if (!q.HasValue("config_groups") || !q.at("config_groups").is_object() ||
      q.at("config_groups").size() != 1) {
    return q.Error("config_groups", "must hold exactly one scheme (one format for all linears)");
  }
  const auto group = q.at("config_groups").begin();
  if (!group.value().is_object()) return q.Error("config_groups", "must hold objects");
  TANDEM_RETURN_IF_ERROR(ParseScheme(
      Section(group.value(), q.source(), absl::StrCat(q.path(), ".config_groups.", group.key())),
      c));
  if (c.packing == Packing::kCtInt && c.bits != 8) {
    return q.Error("format", "int-quantized holds 8-bit weights; 4-bit ones are pack-quantized");
  }
  TANDEM_ASSIGN_OR_RETURN(c.ignore, q.Strings("ignore"));
  c.lm_head = std::find(c.ignore.begin(), c.ignore.end(), "lm_head") == c.ignore.end();
  return absl::OkStatus();
}

}  // namespace

std::string QuantizationConfig::Name() const {
  switch (method) {
    case Method::kNone:
      return "none";
    case Method::kGptq:
      return absl::StrCat("gptq-w", bits, group_size > 0 ? absl::StrCat("-g", group_size) : "",
                          symmetric ? "-sym" : "-asym", act_order ? "-act" : "",
                          gptq_v2 ? "-v2" : "");
    case Method::kAwq:
      return absl::StrCat("awq-w", bits, "-g", group_size);
    case Method::kCompressedTensors:
      return absl::StrCat("ct-w", bits, int8_activations ? "a8" : "",
                          group_size > 0 ? absl::StrCat("-g", group_size) : "-channel",
                          symmetric ? "" : "-asym", act_order ? "-act" : "");
  }
  return "?";
}

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const json& config,
                                                           std::string_view source) {
  QuantizationConfig c;
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return c;
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(source), ": key \"quantization_config\" must be an object"));
  }
  const Section q(*it, std::string(source), "quantization_config");
  TANDEM_ASSIGN_OR_RETURN(std::string method, q.StringOr("quant_method", ""));
  if (method == "gptq") {
    c.method = Method::kGptq;
    TANDEM_RETURN_IF_ERROR(ParseGptq(q, c));
  } else if (method == "awq") {
    c.method = Method::kAwq;
    TANDEM_RETURN_IF_ERROR(ParseAwq(q, c));
  } else if (method == "compressed-tensors") {
    c.method = Method::kCompressedTensors;
    TANDEM_RETURN_IF_ERROR(ParseCompressedTensors(q, c));
  } else {
    return q.Error("quant_method", absl::StrCat("is \"", method,
                                                "\"; Tandem reads gptq, awq and "
                                                "compressed-tensors (integer) checkpoints"));
  }
  return c;
}

}  // namespace tandem::model
