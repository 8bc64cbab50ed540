#include "bench/serving/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem::bench {

double Percentile(const std::vector<double>& sorted, double p) {
  double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

Distribution Summarize(std::vector<double> seconds) {
  Distribution d;
  if (seconds.empty()) return d;
  std::sort(seconds.begin(), seconds.end());
  d.count = static_cast<int64_t>(seconds.size());
  d.mean_ms = 1e3 * std::accumulate(seconds.begin(), seconds.end(), 0.0) / seconds.size();
  d.p50_ms = 1e3 * Percentile(seconds, 50);
  d.p90_ms = 1e3 * Percentile(seconds, 90);
  d.p99_ms = 1e3 * Percentile(seconds, 99);
  d.max_ms = 1e3 * seconds.back();
  return d;
}

std::optional<double> TpotSeconds(const RequestRecord& record) {
  if (record.completion_tokens < 2 || record.first_token_s < 0) return std::nullopt;
  return (record.e2e_s() - record.ttft_s()) / static_cast<double>(record.completion_tokens - 1);
}

bool MeetsSlo(const RequestRecord& record, const Slo& slo) {
  if (!record.ok()) return false;
  if (slo.ttft_ms.has_value()) {
    if (record.first_token_s < 0 || 1e3 * record.ttft_s() > *slo.ttft_ms) return false;
  }
  if (slo.tpot_ms.has_value()) {
    std::optional<double> tpot = TpotSeconds(record);
    if (tpot.has_value() && 1e3 * *tpot > *slo.tpot_ms) return false;
  }
  return true;
}

std::string StatusCodeName(absl::StatusCode code) {
  // absl spells codes as gRPC does and returns "" for values outside the enum.
  std::string name = absl::StatusCodeToString(code);
  return name.empty() ? absl::StrCat("CODE_", static_cast<int>(code)) : name;
}

BenchSummary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                       const Slo& slo) {
  BenchSummary s;
  s.num_requests = static_cast<int64_t>(records.size());
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e, delay;
  int64_t good = 0;
  double first_failed_send = INFINITY;
  for (const RequestRecord& r : records) {
    delay.push_back(std::max(0.0, r.send_s - r.scheduled_s));
    if (!r.ok()) {
      ++s.failed;
      ++s.failures_by_code[StatusCodeName(r.code)];
      if (r.send_s < first_failed_send) {
        first_failed_send = r.send_s;
        s.first_error = absl::StrCat(StatusCodeName(r.code), ": ", r.error);
      }
      continue;
    }
    ++s.completed;
    s.total_prompt_tokens += r.prompt_tokens;
    s.total_completion_tokens += r.completion_tokens;
    if (r.first_token_s >= 0) ttft.push_back(r.ttft_s());
    if (std::optional<double> t = TpotSeconds(r)) tpot.push_back(*t);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    e2e.push_back(r.e2e_s());
    if (slo.any() && MeetsSlo(r, slo)) ++good;
  }
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.output_throughput = s.total_completion_tokens / duration_s;
    s.total_token_throughput = (s.total_prompt_tokens + s.total_completion_tokens) / duration_s;
  }
  s.ttft = Summarize(std::move(ttft));
  s.tpot = Summarize(std::move(tpot));
  s.itl = Summarize(std::move(itl));
  s.e2e = Summarize(std::move(e2e));
  s.send_delay = Summarize(std::move(delay));
  if (slo.any()) {
    s.good_requests = good;
    s.goodput = duration_s > 0 ? good / duration_s : 0.0;
  }
  return s;
}

}  // namespace tandem::bench
