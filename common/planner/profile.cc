#include "common/planner/profile.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::planner {
namespace {

constexpr char kFormat[] = "tandem-engine-profile";
constexpr size_t kMaxSamples = 4096;
constexpr int64_t kMaxTokens = int64_t{1} << 24;
constexpr int64_t kMaxContext = int64_t{1} << 32;
constexpr double kMaxSeconds = 3600;

nlohmann::json StepsJson(const std::vector<StepSample>& samples, const char* tokens_key) {
  auto list = nlohmann::json::array();
  for (const StepSample& s : samples) {
    list.push_back({{tokens_key, s.tokens}, {"context", s.context}, {"seconds", s.seconds}});
  }
  return list;
}

absl::StatusOr<const nlohmann::json*> ListOf(const nlohmann::json& object, const char* key,
                                             std::string_view source, bool required) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    if (required) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(source), ": key \"", key, "\" is missing"));
    }
    return nullptr;
  }
  if (!it->is_array() || it->size() > kMaxSamples) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": key \"", key,
                                                   "\" must be a list of at most ", kMaxSamples,
                                                   " samples"));
  }
  return &*it;
}

absl::StatusOr<std::vector<StepSample>> ParseSteps(const nlohmann::json& object, const char* key,
                                                   const char* tokens_key,
                                                   std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* list, ListOf(object, key, source, true));
  std::vector<StepSample> samples;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& item = (*list)[i];
    const std::string where = absl::StrCat(std::string(source), ": ", key, "[", i, "]");
    if (!item.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
    }
    const JsonFields f(item, where);
    StepSample s;
    TANDEM_ASSIGN_OR_RETURN(s.tokens, f.Int(tokens_key, 1, kMaxTokens));
    TANDEM_ASSIGN_OR_RETURN(s.context, f.Int("context", 0, kMaxContext));
    TANDEM_ASSIGN_OR_RETURN(s.seconds, f.Number("seconds", 0, kMaxSeconds));
    samples.push_back(s);
  }
  return samples;
}

// Piecewise linear through (xs, ys), xs ascending and distinct: ys[0] below xs[0]. Beyond the
// end, the slope from the last point to the nearest one at most 2/3 of its x (neighbours closer
// than that give a slope that is mostly noise), or proportional to x when there is none.
double Interpolate(const std::vector<int64_t>& xs, const std::vector<double>& ys, double x) {
  if (x <= static_cast<double>(xs.front())) return ys.front();
  const double x_last = static_cast<double>(xs.back());
  if (x > x_last) {
    for (size_t j = xs.size() - 1; j-- > 0;) {
      const double xj = static_cast<double>(xs[j]);
      if (xj * 1.5 <= x_last) return ys.back() + (ys.back() - ys[j]) / (x_last - xj) * (x - x_last);
    }
    return ys.back() * x / x_last;
  }
  size_t i = 1;
  while (i + 1 < xs.size() && x > static_cast<double>(xs[i])) ++i;
  const double x0 = static_cast<double>(xs[i - 1]), x1 = static_cast<double>(xs[i]);
  return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0);
}

}  // namespace

std::string EngineProfile::ToJson() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["machine"] = machine;
  j["created"] = created;
  j["threads"] = threads;
  j["model"] = {{"name", model},
                {"weights", weights},
                {"cpu_gemm", cpu_gemm},
                {"kv_dtype", kv_dtype},
                {"parameters", parameters},
                {"num_layers", num_layers},
                {"pop_start_layer", pop_start_layer},
                {"kv_bytes_per_token", kv_bytes_per_token},
                {"block_size", block_size}};
  j["prefill"] = StepsJson(prefill, "tokens");
  j["decode"] = StepsJson(decode, "batch");
  auto list = nlohmann::json::array();
  for (const TransferSample& t : transfer) {
    list.push_back({{"transport", t.transport}, {"bytes", t.bytes}, {"seconds", t.seconds}});
  }
  j["kv_transfer"] = list;
  j["token_overhead_seconds"] = token_overhead_seconds;
  j["shared_overhead_seconds"] = shared_overhead_seconds;
  j["shared_step_overhead_seconds"] = shared_step_overhead_seconds;
  j["handoff_overhead_seconds"] = handoff_overhead_seconds;
  j["import_overhead_seconds"] = import_overhead_seconds;
  return j.dump(1);
}

absl::StatusOr<EngineProfile> EngineProfile::FromJson(std::string_view text,
                                                      std::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(text, source));
  const JsonFields top(j, source);
  TANDEM_ASSIGN_OR_RETURN(std::string format, top.String("format"));
  if (format != kFormat) {
    return top.Error("format", absl::StrCat("is \"", format, "\", expected \"", kFormat, "\""));
  }
  TANDEM_ASSIGN_OR_RETURN(int64_t version, top.Int("version", 1, 1000));
  if (version != kVersion) {
    return top.Error("version",
                     absl::StrCat("is ", version, "; this build reads version ", kVersion));
  }
  EngineProfile p;
  TANDEM_ASSIGN_OR_RETURN(p.machine, top.StringOr("machine", ""));
  TANDEM_ASSIGN_OR_RETURN(p.created, top.StringOr("created", ""));
  TANDEM_ASSIGN_OR_RETURN(int64_t threads, top.Int("threads", 1, 4096));
  p.threads = static_cast<int>(threads);
  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) {
    return top.Error("model", "must be an object");
  }
  const std::string model_source = absl::StrCat(std::string(source), ": model");
  const JsonFields m(*model, model_source);
  TANDEM_ASSIGN_OR_RETURN(p.model, m.StringOr("name", ""));
  TANDEM_ASSIGN_OR_RETURN(p.weights, m.StringOr("weights", ""));
  TANDEM_ASSIGN_OR_RETURN(p.cpu_gemm, m.StringOr("cpu_gemm", ""));
  TANDEM_ASSIGN_OR_RETURN(p.kv_dtype, m.StringOr("kv_dtype", ""));
  TANDEM_ASSIGN_OR_RETURN(p.parameters, m.IntOr("parameters", 0, 0, int64_t{1} << 50));
  TANDEM_ASSIGN_OR_RETURN(int64_t layers, m.Int("num_layers", 1, 4096));
  p.num_layers = static_cast<int>(layers);
  TANDEM_ASSIGN_OR_RETURN(int64_t pop, m.IntOr("pop_start_layer", layers, 1, layers));
  p.pop_start_layer = static_cast<int>(pop);
  TANDEM_ASSIGN_OR_RETURN(p.kv_bytes_per_token, m.Int("kv_bytes_per_token", 1, int64_t{1} << 30));
  TANDEM_ASSIGN_OR_RETURN(int64_t block, m.Int("block_size", 1, 4096));
  p.block_size = static_cast<int>(block);
  TANDEM_ASSIGN_OR_RETURN(p.prefill, ParseSteps(j, "prefill", "tokens", source));
  TANDEM_ASSIGN_OR_RETURN(p.decode, ParseSteps(j, "decode", "batch", source));
  TANDEM_ASSIGN_OR_RETURN(const nlohmann::json* transfer, ListOf(j, "kv_transfer", source, false));
  for (size_t i = 0; transfer != nullptr && i < transfer->size(); ++i) {
    const nlohmann::json& item = (*transfer)[i];
    const std::string where = absl::StrCat(std::string(source), ": kv_transfer[", i, "]");
    if (!item.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
    }
    const JsonFields f(item, where);
    TransferSample t;
    TANDEM_ASSIGN_OR_RETURN(t.transport, f.String("transport"));
    if (t.transport != "grpc" && t.transport != "shm" && t.transport != "ucx") {
      return f.Error("transport",
                     absl::StrCat("is \"", t.transport, "\", expected grpc, shm or ucx"));
    }
    TANDEM_ASSIGN_OR_RETURN(t.bytes, f.Int("bytes", 1, int64_t{1} << 40));
    TANDEM_ASSIGN_OR_RETURN(t.seconds, f.Number("seconds", 0, kMaxSeconds));
    p.transfer.push_back(std::move(t));
  }
  TANDEM_ASSIGN_OR_RETURN(p.token_overhead_seconds,
                          top.NumberOr("token_overhead_seconds", 0, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(p.shared_overhead_seconds,
                          top.NumberOr("shared_overhead_seconds", 0, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(p.shared_step_overhead_seconds,
                          top.NumberOr("shared_step_overhead_seconds", 0, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(p.handoff_overhead_seconds,
                          top.NumberOr("handoff_overhead_seconds", 0, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(p.import_overhead_seconds,
                          top.NumberOr("import_overhead_seconds", 0, 0, 1));
  // Fitting checks what a simulator needs of the samples (enough of them, distinct sizes).
  TANDEM_RETURN_IF_ERROR(StepModel::Fit(p.prefill, true, source).status());
  TANDEM_RETURN_IF_ERROR(StepModel::Fit(p.decode, false, source).status());
  return p;
}

absl::StatusOr<StepModel> StepModel::Fit(const std::vector<StepSample>& samples, bool prefill,
                                         std::string_view what) {
  const char* phase = prefill ? "prefill" : "decode";
  if (samples.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": no ", phase, " samples"));
  }
  // Groups of equal token count: (work, seconds) pairs.
  std::map<int64_t, std::vector<std::pair<double, double>>> groups;
  for (const StepSample& s : samples) {
    const double work = prefill ? PrefillWork(s.tokens, s.context) : static_cast<double>(s.context);
    groups[s.tokens].emplace_back(work, s.seconds);
  }
  // The slope within groups: sum (w - mean_w)(s - mean_s) / sum (w - mean_w)^2 over all groups.
  double cross = 0, square = 0;
  std::vector<std::pair<double, double>> means;  // per group, in token order
  for (const auto& [tokens, points] : groups) {
    double mw = 0, ms = 0;
    for (const auto& [w, s] : points) {
      mw += w;
      ms += s;
    }
    mw /= static_cast<double>(points.size());
    ms /= static_cast<double>(points.size());
    for (const auto& [w, s] : points) {
      cross += (w - mw) * (s - ms);
      square += (w - mw) * (w - mw);
    }
    means.emplace_back(mw, ms);
  }
  StepModel model;
  model.per_work_ = square > 0 ? std::max(0.0, cross / square) : 0.0;
  size_t i = 0;
  for (const auto& entry : groups) {
    model.tokens_.push_back(entry.first);
    model.base_.push_back(std::max(0.0, means[i].second - model.per_work_ * means[i].first));
    ++i;
  }
  return model;
}

double StepModel::Seconds(int64_t tokens, double work) const {
  if (tokens <= 0) return 0;
  return Interpolate(tokens_, base_, static_cast<double>(tokens)) + per_work_ * work;
}

absl::StatusOr<TransferModel> TransferModel::Fit(const EngineProfile& profile,
                                                 std::string_view transport) {
  std::map<int64_t, double> points;
  for (const TransferSample& t : profile.transfer) {
    if (t.transport == transport) points[t.bytes] = t.seconds;
  }
  if (points.empty()) {
    return absl::NotFoundError(
        absl::StrCat("the profile has no kv_transfer samples for ", std::string(transport)));
  }
  TransferModel m;
  for (const auto& [x, y] : points) {
    m.bytes_.push_back(x);
    m.seconds_.push_back(y);
  }
  return m;
}

double TransferModel::Seconds(int64_t bytes) const {
  if (bytes <= 0) return 0.0;
  // Beyond the largest sample: at its rate, not the last segment's slope (a fixed cost per
  // transfer is already in the smaller samples).
  if (bytes > bytes_.back()) return seconds_.back() * static_cast<double>(bytes) / bytes_.back();
  if (bytes < bytes_.front()) return seconds_.front();
  return Interpolate(bytes_, seconds_, static_cast<double>(bytes));
}

absl::StatusOr<double> TransferSeconds(const EngineProfile& profile, std::string_view transport,
                                       int64_t bytes) {
  TANDEM_ASSIGN_OR_RETURN(TransferModel model, TransferModel::Fit(profile, transport));
  return model.Seconds(bytes);
}

std::string PlannedTransport(const EngineProfile& profile, std::string_view transport,
                             bool shared_memory, bool* fell_back) {
  if (fell_back != nullptr) *fell_back = false;
  if (transport == "ucx") {
    for (const TransferSample& t : profile.transfer) {
      if (t.transport == "ucx") return "ucx";
    }
    if (fell_back != nullptr) *fell_back = true;
    return "grpc";
  }
  return transport != "grpc" && shared_memory ? "shm" : "grpc";
}

}  // namespace tandem::planner
