#include "common/planner/planner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::planner {

Workload JudgedAt(const Workload& w, double rate) {
  // A burst of a few hundred requests can meet the SLOs at any rate, if the deployment works
  // through all of them within the TTFT bound: each simulation runs at least kLifetimes
  // request lifetimes (the SLOs' TTFT plus an output's tokens at the TPOT bound) of arrivals,
  // so a rate above what the deployment sustains builds a queue that misses them.
  constexpr double kLifetimes = 4;
  constexpr int64_t kMaxRequests = 1'000'000;
  const double lifetime = w.slo_ttft_s + w.slo_tpot_s * w.output_len;
  Workload longer = w;
  longer.num_requests =
      std::clamp<int64_t>(std::llround(rate * kLifetimes * lifetime), w.num_requests, kMaxRequests);
  return longer;
}

absl::StatusOr<std::pair<double, SimulationResult>> MaxGoodRate(const EngineProfile& profile,
                                                                const Deployment& d,
                                                                const Workload& w,
                                                                double max_rate) {
  auto run = [&](double rate) { return Simulate(profile, d, JudgedAt(w, rate), rate); };
  // From a rate the deployment surely meets, double until it fails, then bisect. The same draws
  // serve every rate (Simulate scales arrival gaps), so attainment falls with rate but for
  // the workload's own luck.
  constexpr double kFloor = 1e-3;
  double good = 0, bad = 0;
  SimulationResult best;
  for (double rate = 0.1;; rate *= 2) {
    rate = std::min(rate, max_rate);
    TANDEM_ASSIGN_OR_RETURN(SimulationResult r, run(rate));
    if (r.attainment >= w.attainment) {
      good = rate;
      best = r;
      if (rate >= max_rate) return std::make_pair(good, best);
    } else {
      bad = rate;
      break;
    }
  }
  if (good == 0) {  // below 0.1 req/s: search down before giving up
    for (double rate = bad / 2; rate >= kFloor; rate /= 2) {
      TANDEM_ASSIGN_OR_RETURN(SimulationResult r, run(rate));
      if (r.attainment >= w.attainment) {
        good = rate;
        best = r;
        break;
      }
      bad = rate;
    }
    if (good == 0) return std::make_pair(0.0, best);
  }
  while (bad - good > 0.005 * good) {
    const double mid = (good + bad) / 2;
    TANDEM_ASSIGN_OR_RETURN(SimulationResult r, run(mid));
    if (r.attainment >= w.attainment) {
      good = mid;
      best = r;
    } else {
      bad = mid;
    }
  }
  return std::make_pair(good, best);
}

absl::StatusOr<std::vector<Candidate>> Plan(const EngineProfile& profile, const Workload& w,
                                            const PlanOptions& options) {
  if (options.budget < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--budget must be at least 1, got ", options.budget));
  }
  if (options.max_num_seqs.empty()) {
    return absl::InvalidArgumentError("no decode batch limits (max_num_seqs) to try");
  }
  const int unit = std::min(options.budget, std::max(1, options.max_unit));
  const int copies = options.budget / unit;
  std::vector<Deployment> deployments;
  for (int seqs : options.max_num_seqs) {
    Deployment d;
    d.engine = options.engine;
    d.engine.max_num_seqs = seqs;
    d.prefill = options.prefill;
    d.transport = options.transport;
    if (options.colocated) {
      d.replicas = unit;
      deployments.push_back(d);
    }
    if (options.disaggregated) {
      d.disaggregated = true;
      for (int p = 1; p < unit; ++p) {
        d.prefill_replicas = p;
        d.replicas = unit - p;
        deployments.push_back(d);
      }
    }
  }
  std::vector<Candidate> out;
  for (const Deployment& d : deployments) {
    TANDEM_ASSIGN_OR_RETURN(auto found, MaxGoodRate(profile, d, w, options.max_rate / copies));
    Candidate c;
    c.deployment = d;
    c.copies = copies;
    c.goodput = found.first * copies;
    c.per_replica = c.goodput / (copies * unit);
    c.at_goodput = found.second;
    out.push_back(c);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Candidate& a, const Candidate& b) { return a.goodput > b.goodput; });
  // One row per shape (colocated, or a prefill:decode split): its best batch limit.
  std::vector<Candidate> best;
  for (const Candidate& c : out) {
    const bool seen = std::any_of(best.begin(), best.end(), [&](const Candidate& b) {
      return b.deployment.disaggregated == c.deployment.disaggregated &&
             b.deployment.prefill_replicas == c.deployment.prefill_replicas &&
             b.deployment.replicas == c.deployment.replicas;
    });
    if (!seen) best.push_back(c);
  }
  return best;
}

std::string CandidatesTable(const std::vector<Candidate>& candidates, size_t max_rows) {
  std::string s =
      "| deployment | copies | goodput req/s | per replica | TTFT p50 / p90 / p99 ms | TPOT p50 "
      "/ p90 / p99 ms | output tok/s |\n|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < candidates.size() && i < max_rows; ++i) {
    const Candidate& c = candidates[i];
    const SimulationResult& r = c.at_goodput;
    absl::StrAppend(
        &s, absl::StrFormat("| %s | %d | %.3g | %.3g | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f | "
                            "%.0f |\n",
                            c.deployment.Describe(), c.copies, c.goodput, c.per_replica,
                            r.ttft.p50 * 1e3, r.ttft.p90 * 1e3, r.ttft.p99 * 1e3, r.tpot.p50 * 1e3,
                            r.tpot.p90 * 1e3, r.tpot.p99 * 1e3, r.output_tokens_per_s * c.copies));
  }
  return s;
}

std::string CandidatesJson(const std::vector<Candidate>& candidates) {
  auto list = nlohmann::json::array();
  auto pct = [](const Percentiles& p) {
    return nlohmann::json{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
  };
  for (const Candidate& c : candidates) {
    const Deployment& d = c.deployment;
    const SimulationResult& r = c.at_goodput;
    list.push_back({{"deployment", d.Describe()},
                    {"disaggregated", d.disaggregated},
                    {"prefill_replicas", d.disaggregated ? d.prefill_replicas : 0},
                    {"decode_replicas", d.disaggregated ? d.replicas : 0},
                    {"colocated_replicas", d.disaggregated ? 0 : d.replicas},
                    {"max_num_seqs", d.engine.max_num_seqs},
                    {"copies", c.copies},
                    {"goodput", c.goodput},
                    {"per_replica", c.per_replica},
                    {"attainment", r.attainment},
                    {"ttft_seconds", pct(r.ttft)},
                    {"tpot_seconds", pct(r.tpot)},
                    {"output_tokens_per_second", r.output_tokens_per_s * c.copies},
                    {"preemptions", r.preemptions}});
  }
  return list.dump(1);
}

}  // namespace tandem::planner
