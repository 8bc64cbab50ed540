#include "common/planner/recommend.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tandem::planner {
namespace {

// The best deployment of the shape with n replicas at `rate`: each prefill:decode split (or the
// colocated one) simulated once; the highest attainment wins, the lower TTFT p90 breaks ties.
struct Sized {
  Deployment d;
  SimulationResult r;
  bool meets = false;
};

absl::StatusOr<Sized> BestOf(const EngineProfile& profile, const Workload& w, int n, double rate,
                             const RecommendOptions& o) {
  Deployment base;
  base.disaggregated = o.disaggregated;
  base.prefill = o.prefill;
  base.engine = o.engine;
  base.transport = o.transport;
  std::vector<Deployment> shapes;
  if (!o.disaggregated) {
    base.replicas = n;
    shapes.push_back(base);
  } else {
    for (int p = 1; p < n; ++p) {
      base.prefill_replicas = p;
      base.replicas = n - p;
      shapes.push_back(base);
    }
  }
  const Workload judged = JudgedAt(w, rate);
  std::optional<Sized> best;
  for (const Deployment& d : shapes) {
    TANDEM_ASSIGN_OR_RETURN(SimulationResult r, Simulate(profile, d, judged, rate));
    const bool better = !best || r.attainment > best->r.attainment ||
                        (r.attainment == best->r.attainment && r.ttft.p90 < best->r.ttft.p90);
    if (better) best = Sized{d, r, r.attainment >= w.attainment};
  }
  return *best;
}

// The smallest x in (lo, hi] whose eval(x) meets the target, with its deployment, given that
// hi's (`at_hi`) does and lo's does not: meeting is monotone in replicas, so a bisection.
template <typename Eval>
absl::StatusOr<std::pair<int, Sized>> Smallest(int lo, int hi, Sized at_hi, const Eval& eval) {
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    TANDEM_ASSIGN_OR_RETURN(Sized s, eval(mid));
    if (s.meets) {
      hi = mid;
      at_hi = s;
    } else {
      lo = mid;
    }
  }
  return std::make_pair(hi, at_hi);
}

// The factor within the correction bounds at which `mean(factor)`, taken to grow with it, is
// `target`: bisection on a log scale (to 0.1%), or the bound nearest a target out of reach.
absl::StatusOr<double> Solve(const std::function<absl::StatusOr<double>(double)>& mean,
                             double target) {
  double lo = Corrections::kMin, hi = Corrections::kMax;
  TANDEM_ASSIGN_OR_RETURN(const double at_lo, mean(lo));
  if (target <= at_lo) return lo;
  TANDEM_ASSIGN_OR_RETURN(const double at_hi, mean(hi));
  if (target >= at_hi) return hi;
  for (int i = 0; i < 12; ++i) {
    const double mid = std::sqrt(lo * hi);
    TANDEM_ASSIGN_OR_RETURN(const double at_mid, mean(mid));
    (at_mid < target ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

}  // namespace

EngineProfile Corrected(const EngineProfile& profile, const Corrections& c) {
  EngineProfile p = profile;
  for (StepSample& s : p.prefill) s.seconds *= c.prefill;
  p.handoff_overhead_seconds *= c.prefill;
  for (StepSample& s : p.decode) s.seconds *= c.decode;
  p.token_overhead_seconds *= c.decode;
  p.import_overhead_seconds *= c.decode;
  return p;
}

absl::StatusOr<Corrections> FitCorrections(const EngineProfile& profile, const Deployment& live,
                                           const Workload& w, double rate, double ttft_s,
                                           double tpot_s) {
  Corrections c;
  // The simulated mean TTFT (or TPOT) with the decode (or prefill) factor at `f`.
  auto mean = [&](bool ttft) {
    return [&, ttft](double f) -> absl::StatusOr<double> {
      Corrections at = c;
      (ttft ? at.prefill : at.decode) = f;
      TANDEM_ASSIGN_OR_RETURN(const SimulationResult r,
                              Simulate(Corrected(profile, at), live, w, rate));
      return ttft ? r.ttft.mean : r.tpot.mean;
    };
  };
  for (int pass = 0; pass < 2; ++pass) {
    if (tpot_s > 0) {
      TANDEM_ASSIGN_OR_RETURN(c.decode, Solve(mean(false), tpot_s));
    }
    if (ttft_s > 0) {
      TANDEM_ASSIGN_OR_RETURN(c.prefill, Solve(mean(true), ttft_s));
    }
  }
  return c;
}

absl::StatusOr<Recommendation> Recommend(const EngineProfile& profile, const Workload& w,
                                         double rate, const RecommendOptions& o) {
  if (!(rate > 0) || !std::isfinite(rate)) {
    return absl::InvalidArgumentError(absl::StrCat("rate must be positive, got ", rate));
  }
  const int smallest = o.disaggregated ? 2 : 1;
  if (o.max_replicas < smallest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_replicas must be at least ", smallest, " for a ",
        o.disaggregated ? "disaggregated" : "colocated", " deployment, got ", o.max_replicas));
  }
  if (!(o.headroom >= 1) || !std::isfinite(o.headroom)) {
    return absl::InvalidArgumentError(
        absl::StrCat("headroom must be at least 1, got ", o.headroom));
  }
  Recommendation out;
  out.target_rate = rate * o.headroom;
  auto finish = [&](const Sized& s, int copies) {
    out.feasible = s.meets;
    out.unit = s.d;
    out.copies = copies;
    out.at_target = s.r;
    out.prefill_replicas = s.d.disaggregated ? s.d.prefill_replicas * copies : 0;
    out.decode_replicas = s.d.replicas * copies;
    return out;
  };
  // The smallest deployment up to max_unit replicas that meets the target: attainment grows
  // with replicas, so a bisection over the size finds it.
  const int unit = std::max(smallest, std::min(o.max_replicas, o.max_unit));
  TANDEM_ASSIGN_OR_RETURN(Sized largest, BestOf(profile, w, unit, out.target_rate, o));
  if (largest.meets) {
    TANDEM_ASSIGN_OR_RETURN(auto found, Smallest(smallest - 1, unit, largest, [&](int n) {
                              return BestOf(profile, w, n, out.target_rate, o);
                            }));
    return finish(found.second, 1);
  }
  // Beyond one unit: copies of a unit-sized deployment, each taking its share of the rate.
  const int max_copies = o.max_replicas / unit;
  if (max_copies < 2) return finish(largest, 1);
  TANDEM_ASSIGN_OR_RETURN(Sized most, BestOf(profile, w, unit, out.target_rate / max_copies, o));
  if (!most.meets) return finish(most, max_copies);
  TANDEM_ASSIGN_OR_RETURN(auto copies, Smallest(1, max_copies, most, [&](int k) {
                            return BestOf(profile, w, unit, out.target_rate / k, o);
                          }));
  // The fewest copies found, each then made as small as its share of the rate allows.
  const int k = copies.first;
  TANDEM_ASSIGN_OR_RETURN(auto each, Smallest(smallest - 1, unit, copies.second, [&](int n) {
                            return BestOf(profile, w, n, out.target_rate / k, o);
                          }));
  return finish(each.second, k);
}

}  // namespace tandem::planner
