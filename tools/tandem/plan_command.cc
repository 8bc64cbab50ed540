// tandem plan: the placement planner (common/planner) on an engine profile and a workload.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/serving/arrivals.h"
#include "bench/serving/dataset.h"
#include "common/config/config.h"
#include "common/planner/planner.h"
#include "common/planner/recommend.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/tandem/commands.h"
#include "yaml-cpp/yaml.h"

namespace tandem::cli {
namespace {

// Workload keys, in the file as in flags (the flag's dashes are the key's underscores), named
// as `tandem bench`'s flags so a plan and its validation run describe the same requests.
constexpr const char* kWorkloadKeys[] = {"input-len",        "input-len-range", "output-len",
                                         "output-len-range", "num-requests",    "seed",
                                         "slo-ttft-ms",      "slo-tpot-ms",     "attainment"};

std::string KeyOf(const std::string& flag) {
  std::string key = flag;
  for (char& c : key) c = c == '-' ? '_' : c;
  return key;
}

// The value of workload key `flag`: the flag if given, else the file's key, else `fallback`.
absl::StatusOr<double> WorkloadValue(const CliArgs& args, const YAML::Node& file,
                                     const std::string& flag, double fallback, double min,
                                     double max) {
  double v = fallback;
  if (args.Has(flag)) {
    TANDEM_ASSIGN_OR_RETURN(v, args.DoubleOr(flag, fallback));
  } else if (file && file[KeyOf(flag)]) {
    try {
      v = file[KeyOf(flag)].as<double>();
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload: \"", KeyOf(flag), "\" must be a number"));
    }
  }
  if (!(v >= min && v <= max)) {
    return absl::InvalidArgumentError(
        absl::StrCat("workload: ", KeyOf(flag), " is ", v, ", outside [", min, ", ", max, "]"));
  }
  return v;
}

// --dataset FILE: a trace in tandem bench's dataset format (JSON Lines), as `tandem bench
// --dataset` sends it; text prompts are counted with --model's tokenizer, as the router counts
// them.
absl::Status LoadTrace(const CliArgs& args, planner::Workload& w) {
  for (const char* flag : {"input-len", "input-len-range", "output-len", "output-len-range"}) {
    if (args.Has(flag)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " describes random prompts; --dataset gives its own lengths"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("dataset"));
  TANDEM_ASSIGN_OR_RETURN(std::vector<bench::BenchRequest> lines, bench::LoadJsonlDataset(path));
  std::optional<std::vector<int32_t>> lengths = bench::PromptLengths(lines);
  if (!lengths.has_value()) {
    if (!args.Has("model")) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": text prompts need --model DIR to count their tokens (or give input_length)"));
    }
    TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                            tokenizer::Tokenizer::Load(dir));
    lengths.emplace();
    for (const bench::BenchRequest& r : lines) {
      if (!r.prompt.empty()) {
        TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(r.prompt, true));
        lengths->push_back(static_cast<int32_t>(ids.size()));
      } else {
        lengths->push_back(r.input_length);
      }
    }
  }
  double prompt_sum = 0, output_sum = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    w.trace.push_back({std::max(0.0, lines[i].timestamp_s), (*lengths)[i], lines[i].max_tokens});
    prompt_sum += (*lengths)[i];
    output_sum += lines[i].max_tokens;
  }
  const auto n = static_cast<double>(lines.size());
  w.input_len = std::max(1, static_cast<int32_t>(std::lround(prompt_sum / n)));
  w.output_len = std::max(1, static_cast<int32_t>(std::lround(output_sum / n)));
  w.input_len_range = w.output_len_range = 0;
  if (!args.Has("num-requests")) w.num_requests = static_cast<int64_t>(lines.size());
  return absl::OkStatus();
}

absl::StatusOr<planner::Workload> LoadWorkload(const CliArgs& args) {
  YAML::Node file;
  if (args.Has("workload")) {
    TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("workload"));
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    try {
      file = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
    }
    if (!file.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a mapping"));
    for (const auto& entry : file) {
      const std::string key = entry.first.as<std::string>();
      bool known = false;
      for (const char* k : kWorkloadKeys) known |= KeyOf(k) == key;
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": unknown key \"", key, "\""));
      }
    }
  }
  planner::Workload w;
  TANDEM_ASSIGN_OR_RETURN(double input, WorkloadValue(args, file, "input-len", 512, 1, 1 << 20));
  TANDEM_ASSIGN_OR_RETURN(w.input_len_range, WorkloadValue(args, file, "input-len-range", 0, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(double output, WorkloadValue(args, file, "output-len", 128, 1, 1 << 20));
  TANDEM_ASSIGN_OR_RETURN(w.output_len_range,
                          WorkloadValue(args, file, "output-len-range", 0, 0, 1));
  TANDEM_ASSIGN_OR_RETURN(double requests,
                          WorkloadValue(args, file, "num-requests", 1000, 10, 1e6));
  TANDEM_ASSIGN_OR_RETURN(double seed, WorkloadValue(args, file, "seed", 1, 0, 1e15));
  TANDEM_ASSIGN_OR_RETURN(double ttft, WorkloadValue(args, file, "slo-ttft-ms", 0, 0, 1e7));
  TANDEM_ASSIGN_OR_RETURN(double tpot, WorkloadValue(args, file, "slo-tpot-ms", 0, 0, 1e7));
  TANDEM_ASSIGN_OR_RETURN(w.attainment, WorkloadValue(args, file, "attainment", 0.9, 0.01, 1));
  if (ttft <= 0 && tpot <= 0) {
    return absl::InvalidArgumentError(
        "workload: give slo-ttft-ms and/or slo-tpot-ms: without an SLO every rate is good");
  }
  w.input_len = static_cast<int32_t>(input);
  w.output_len = static_cast<int32_t>(output);
  w.num_requests = static_cast<int64_t>(requests);
  w.seed = static_cast<uint64_t>(seed);
  w.slo_ttft_s = ttft / 1e3;
  w.slo_tpot_s = tpot / 1e3;
  if (args.Has("dataset")) TANDEM_RETURN_IF_ERROR(LoadTrace(args, w));
  return w;
}

// --deployment (or another flag) colocated:N | disaggregated:P:D
absl::StatusOr<planner::Deployment> ParseDeployment(const std::string& text,
                                                    const planner::PlanOptions& o,
                                                    const char* flag = "deployment") {
  planner::Deployment d;
  d.engine = o.engine;
  d.engine.max_num_seqs = o.max_num_seqs.front();
  d.prefill = o.prefill;
  d.transport = o.transport;
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  int p = 0, n = 0;
  const bool colocated = parts.size() == 2 && parts[0] == "colocated" &&
                         absl::SimpleAtoi(parts[1], &n) && n >= 1 && n <= 4096;
  const bool disaggregated = parts.size() == 3 && parts[0] == "disaggregated" &&
                             absl::SimpleAtoi(parts[1], &p) && absl::SimpleAtoi(parts[2], &n) &&
                             p >= 1 && n >= 1 && p <= 4096 && n <= 4096;
  if (!colocated && !disaggregated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": \"", text, "\" is not colocated:N or disaggregated:PREFILL:DECODE"));
  }
  d.disaggregated = disaggregated;
  d.prefill_replicas = p;
  d.replicas = n;
  return d;
}

// The requests `tandem bench` sends at `rate` for the workload's flags and seed, or for its
// trace (--dataset): the same send times and lengths.
std::vector<planner::SimRequest> BenchRequests(const planner::Workload& w, double rate) {
  std::vector<planner::SimRequest> schedule;
  if (w.trace.empty()) {
    // Its random dataset's lengths (the token ids do not matter here).
    const std::vector<double> arrivals = bench::BenchSchedule(w.num_requests, rate, w.seed);
    const std::vector<bench::BenchRequest> requests =
        bench::MakeRandomDataset({.num_requests = w.num_requests,
                                  .input_len = w.input_len,
                                  .input_len_range = w.input_len_range,
                                  .output_len = w.output_len,
                                  .output_len_range = w.output_len_range,
                                  .vocab_size = 2,
                                  .seed = w.seed});
    for (size_t i = 0; i < requests.size(); ++i) {
      schedule.push_back({arrivals[i], static_cast<int32_t>(requests[i].prompt_token_ids.size()),
                          requests[i].max_tokens});
    }
    return schedule;
  }
  std::vector<double> recorded;
  for (const planner::SimRequest& r : w.trace) recorded.push_back(r.arrival);
  std::vector<double> arrivals = planner::TraceSchedule(recorded, w.num_requests, rate);
  if (arrivals.empty()) arrivals = bench::BenchSchedule(w.num_requests, rate, w.seed);
  for (int64_t i = 0; i < w.num_requests; ++i) {
    const planner::SimRequest& r = w.trace[static_cast<size_t>(i) % w.trace.size()];
    schedule.push_back({arrivals[static_cast<size_t>(i)], r.prompt, r.output});
  }
  return schedule;
}

// tandem plan --deployment D --rates R1,R2: the simulator's prediction at each rate for the
// requests `tandem bench` sends with the same flags and seed, for comparing with a measurement.
// With a timestamped --dataset, --rates may be left out: the trace's own rate.
absl::Status RunSimulations(const CliArgs& args, const planner::EngineProfile& profile,
                            const planner::Workload& w, const planner::PlanOptions& o) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, args.String("deployment"));
  TANDEM_ASSIGN_OR_RETURN(planner::Deployment d, ParseDeployment(text, o));
  std::vector<std::string> rates =
      absl::StrSplit(args.StringOr("rates", ""), ',', absl::SkipEmpty());
  std::vector<double> recorded;
  for (const planner::SimRequest& r : w.trace) recorded.push_back(r.arrival);
  if (rates.empty() && planner::TraceRate(recorded) > 0) {
    rates.push_back(absl::StrCat(planner::TraceRate(recorded)));
  }
  if (rates.empty()) return absl::InvalidArgumentError("--deployment needs --rates R1,R2,...");
  auto list = nlohmann::json::array();
  auto pct = [](const planner::Percentiles& p) {
    return nlohmann::json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
  };
  if (!args.Has("json")) {
    std::printf(
        "%s\n\n| req/s | TTFT p50 / p90 / p99 ms | TPOT p50 / p90 / p99 ms | attainment "
        "| goodput req/s | output tok/s |\n|---|---|---|---|---|---|\n",
        d.Describe().c_str());
  }
  for (const std::string& r : rates) {
    double rate = 0;
    if (!absl::SimpleAtod(r, &rate) || !(rate > 0 && rate < 1e9)) {
      return absl::InvalidArgumentError(absl::StrCat("--rates: \"", r, "\" is not a rate"));
    }
    TANDEM_ASSIGN_OR_RETURN(planner::SimulationResult s,
                            planner::SimulateRequests(profile, d, BenchRequests(w, rate), w, rate));
    list.push_back(
        {{"rate", rate},
         {"deployment", d.Describe()},
         {"ttft_seconds", pct(s.ttft)},
         {"tpot_seconds", pct(s.tpot)},
         {"attainment", s.attainment},
         {"goodput", s.goodput},
         {"throughput", s.throughput},
         {"output_tokens_per_second", s.output_tokens_per_s},
         {"preemptions", s.preemptions},
         {"busy_seconds", {{"prefill", s.prefill_busy_s}, {"engine", s.engine_busy_s}}}});
    if (!args.Has("json")) {
      std::printf("| %g | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f | %.0f%% | %.3g | %.0f |\n", rate,
                  s.ttft.p50 * 1e3, s.ttft.p90 * 1e3, s.ttft.p99 * 1e3, s.tpot.p50 * 1e3,
                  s.tpot.p90 * 1e3, s.tpot.p99 * 1e3, s.attainment * 100, s.goodput,
                  s.output_tokens_per_s);
    }
  }
  if (args.Has("json")) std::printf("%s\n", list.dump(1).c_str());
  return absl::OkStatus();
}

// tandem plan --rate R: the smallest deployment of one shape that meets the SLOs at R (with
// --headroom), as the router's planner advisor recommends it.
absl::Status RunRecommend(const CliArgs& args, const planner::EngineProfile& profile,
                          const planner::Workload& w, const planner::PlanOptions& o,
                          const std::string& only) {
  TANDEM_ASSIGN_OR_RETURN(double rate, args.DoubleOr("rate", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t max_replicas, args.IntOr("max-replicas", 64));
  TANDEM_ASSIGN_OR_RETURN(double headroom, args.DoubleOr("headroom", 1.0));
  if (max_replicas < 1 || max_replicas > 1'000'000) {
    return absl::InvalidArgumentError("--max-replicas: in [1, 1e6]");
  }
  // With what a live deployment measured, first the correction factors the router would fit
  // (planner.correction), and the recommendation on the corrected profile.
  std::optional<planner::Corrections> corrections;
  if (args.Has("measured-ttft-ms") || args.Has("measured-tpot-ms")) {
    if (!args.Has("live")) {
      return absl::InvalidArgumentError(
          "--measured-ttft-ms and --measured-tpot-ms need --live, the deployment that measured "
          "them (colocated:N or disaggregated:PREFILL:DECODE)");
    }
    TANDEM_ASSIGN_OR_RETURN(std::string text, args.String("live"));
    TANDEM_ASSIGN_OR_RETURN(planner::Deployment live, ParseDeployment(text, o, "live"));
    TANDEM_ASSIGN_OR_RETURN(double ttft_ms, args.DoubleOr("measured-ttft-ms", 0));
    TANDEM_ASSIGN_OR_RETURN(double tpot_ms, args.DoubleOr("measured-tpot-ms", 0));
    if (!(ttft_ms >= 0 && ttft_ms <= 1e9 && tpot_ms >= 0 && tpot_ms <= 1e9)) {
      return absl::InvalidArgumentError("--measured-ttft-ms, --measured-tpot-ms: in [0, 1e9]");
    }
    TANDEM_ASSIGN_OR_RETURN(
        corrections, planner::FitCorrections(profile, live, w, rate, ttft_ms / 1e3, tpot_ms / 1e3));
    if (!args.Has("json")) {
      std::printf(
          "correction factors fitted on %s at %.3g req/s (mean TTFT %.0f ms, TPOT %.1f ms): "
          "prefill %.3fx, decode %.3fx the profile's time\n",
          live.Describe().c_str(), rate, ttft_ms, tpot_ms, corrections->prefill,
          corrections->decode);
    }
  } else if (args.Has("live")) {
    return absl::InvalidArgumentError(
        "--live needs --measured-ttft-ms and/or --measured-tpot-ms, what it measured");
  }
  const planner::EngineProfile planned =
      corrections.has_value() ? planner::Corrected(profile, *corrections) : profile;
  planner::RecommendOptions r;
  r.prefill = o.prefill;
  r.engine = o.engine;
  r.engine.max_num_seqs = o.max_num_seqs.front();
  r.transport = o.transport;
  r.max_replicas = static_cast<int>(max_replicas);
  r.headroom = headroom;
  r.max_unit = o.max_unit;
  auto list = nlohmann::json::array();
  for (const bool disaggregated : {false, true}) {
    if (only == (disaggregated ? "colocated" : "disaggregated")) continue;
    r.disaggregated = disaggregated;
    TANDEM_ASSIGN_OR_RETURN(planner::Recommendation rec, planner::Recommend(planned, w, rate, r));
    const planner::SimulationResult& s = rec.at_target;
    list.push_back({{"disaggregated", disaggregated},
                    {"feasible", rec.feasible},
                    {"prefill_replicas", rec.prefill_replicas},
                    {"decode_replicas", rec.decode_replicas},
                    {"target_rate", rec.target_rate},
                    {"unit", rec.unit.Describe()},
                    {"copies", rec.copies},
                    {"attainment", s.attainment},
                    {"ttft_p90_seconds", s.ttft.p90},
                    {"tpot_p90_seconds", s.tpot.p90}});
    if (corrections.has_value()) {
      list.back()["correction"] = {{"prefill", corrections->prefill},
                                   {"decode", corrections->decode}};
    }
    if (!args.Has("json")) {
      std::printf(
          "%-13s %s%d prefill + %d decode replicas (%s × %d): attainment %.0f%%, "
          "TTFT p90 %.0f ms, TPOT p90 %.1f ms at %.3g req/s\n",
          disaggregated ? "disaggregated" : "colocated",
          rec.feasible ? "" : "SHORT: ", rec.prefill_replicas, rec.decode_replicas,
          rec.unit.Describe().c_str(), rec.copies, s.attainment * 100, s.ttft.p90 * 1e3,
          s.tpot.p90 * 1e3, rec.target_rate);
    }
  }
  if (args.Has("json")) std::printf("%s\n", list.dump(1).c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunPlan(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"profile",
                                          "workload",
                                          "input-len",
                                          "input-len-range",
                                          "output-len",
                                          "output-len-range",
                                          "num-requests",
                                          "seed",
                                          "slo-ttft-ms",
                                          "slo-tpot-ms",
                                          "attainment",
                                          "budget",
                                          "max-num-seqs",
                                          "kv-cache-bytes",
                                          "max-num-batched-tokens",
                                          "chunk-size",
                                          "stream-interval",
                                          "transport",
                                          "only",
                                          "max-unit",
                                          "json",
                                          "rows",
                                          "deployment",
                                          "rates",
                                          "token-overhead-us",
                                          "shared-overhead-us",
                                          "shared-step-overhead-us",
                                          "handoff-overhead-us",
                                          "import-overhead-us",
                                          "rate",
                                          "max-replicas",
                                          "headroom",
                                          "live",
                                          "measured-ttft-ms",
                                          "measured-tpot-ms",
                                          "dataset",
                                          "model"}));
  TANDEM_ASSIGN_OR_RETURN(std::string profile_path, args.String("profile"));
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(profile_path));
  TANDEM_ASSIGN_OR_RETURN(planner::EngineProfile profile,
                          planner::EngineProfile::FromJson(text, profile_path));
  TANDEM_ASSIGN_OR_RETURN(planner::Workload w, LoadWorkload(args));
  for (auto [flag, field] :
       {std::pair{"token-overhead-us", &profile.token_overhead_seconds},
        std::pair{"shared-overhead-us", &profile.shared_overhead_seconds},
        std::pair{"shared-step-overhead-us", &profile.shared_step_overhead_seconds},
        std::pair{"handoff-overhead-us", &profile.handoff_overhead_seconds},
        std::pair{"import-overhead-us", &profile.import_overhead_seconds}}) {
    if (!args.Has(flag)) continue;
    TANDEM_ASSIGN_OR_RETURN(double us, args.DoubleOr(flag, 0));
    if (!(us >= 0 && us <= 1e6)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": in [0, 1e6]"));
    }
    *field = us * 1e-6;
  }

  const config::TandemConfig defaults;
  planner::PlanOptions o;
  TANDEM_ASSIGN_OR_RETURN(int64_t budget, args.IntOr("budget", 2));
  TANDEM_ASSIGN_OR_RETURN(int64_t kv_bytes,
                          args.IntOr("kv-cache-bytes", defaults.kv_cache.memory_bytes));
  TANDEM_ASSIGN_OR_RETURN(int64_t batched, args.IntOr("max-num-batched-tokens",
                                                      defaults.scheduler.max_num_batched_tokens));
  TANDEM_ASSIGN_OR_RETURN(int64_t chunk, args.IntOr("chunk-size", defaults.scheduler.chunk_size));
  TANDEM_ASSIGN_OR_RETURN(int64_t interval,
                          args.IntOr("stream-interval", defaults.scheduler.stream_interval));
  TANDEM_ASSIGN_OR_RETURN(int64_t unit, args.IntOr("max-unit", 16));
  TANDEM_ASSIGN_OR_RETURN(int64_t rows, args.IntOr("rows", 12));
  if (budget < 1 || budget > 1'000'000 || kv_bytes < 1 || batched < 1 || batched > 1 << 20 ||
      chunk < 1 || chunk > 1 << 20 || unit < 1 || unit > 64 || rows < 1 || interval < 1 ||
      interval > 1024) {
    return absl::InvalidArgumentError(
        "--budget [1, 1e6], --kv-cache-bytes, --max-num-batched-tokens, --chunk-size must be "
        "positive; --max-unit in [1, 64]; --stream-interval in [1, 1024]");
  }
  if (args.Has("max-num-seqs")) {
    TANDEM_ASSIGN_OR_RETURN(o.max_num_seqs, args.IntList("max-num-seqs"));
    for (int s : o.max_num_seqs) {
      if (s < 1 || s > 65536) {
        return absl::InvalidArgumentError("--max-num-seqs: each in [1, 65536]");
      }
    }
  }
  o.budget = static_cast<int>(budget);
  o.max_unit = static_cast<int>(unit);
  o.engine.max_num_batched_tokens = static_cast<int>(batched);
  o.engine.chunk_size = static_cast<int>(chunk);
  o.engine.stream_interval = static_cast<int>(interval);
  o.engine.num_blocks = kv_bytes / (profile.kv_bytes_per_token * profile.block_size);
  o.prefill = o.engine;
  o.prefill.max_num_seqs = defaults.scheduler.max_num_seqs;
  o.transport = args.StringOr("transport", "shm");
  const std::string only = args.StringOr("only", "");
  if (!only.empty() && only != "colocated" && only != "disaggregated") {
    return absl::InvalidArgumentError("--only: colocated or disaggregated");
  }
  if (args.Has("deployment")) return RunSimulations(args, profile, w, o);
  if (args.Has("rate")) return RunRecommend(args, profile, w, o, only);
  o.colocated = only != "disaggregated";
  o.disaggregated = only != "colocated" && o.budget >= 2;
  TANDEM_ASSIGN_OR_RETURN(auto candidates, planner::Plan(profile, w, o));
  if (args.Has("json")) {
    std::printf("%s\n", planner::CandidatesJson(candidates).c_str());
    return absl::OkStatus();
  }
  std::printf(
      "profile: %s (%s, %s weights, %d threads per replica)\nworkload: %sprompts %d ±%.0f%%, "
      "outputs %d ±%.0f%%, %lld requests; SLO: TTFT ≤ %.0f ms, TPOT ≤ %.0f ms for %.0f%%\n"
      "budget: %lld replicas%s\n\n",
      profile_path.c_str(), profile.model.c_str(), profile.weights.c_str(), profile.threads,
      w.trace.empty() ? ""
                      : absl::StrCat("trace ", args.StringOr("dataset", ""), ", mean ").c_str(),
      w.input_len, w.input_len_range * 100, w.output_len, w.output_len_range * 100,
      static_cast<long long>(w.num_requests), w.slo_ttft_s * 1e3, w.slo_tpot_s * 1e3,
      w.attainment * 100, static_cast<long long>(budget),
      candidates.empty() || candidates[0].copies == 1
          ? ""
          : absl::StrCat(
                ", planned as ", candidates[0].copies, " copies of ",
                candidates[0].deployment.replicas + candidates[0].deployment.prefill_replicas,
                " (the rest unused)")
                .c_str());
  std::fputs(planner::CandidatesTable(candidates, static_cast<size_t>(rows)).c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace tandem::cli
