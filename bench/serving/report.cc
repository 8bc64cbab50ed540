#include "bench/serving/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/file_util.h"

namespace tandem::bench {
namespace {

constexpr int kWidth = 52;

void Heading(std::string& out, const std::string& title, char fill) {
  int pad = kWidth - static_cast<int>(title.size()) - (title.empty() ? 0 : 2);
  std::string left(static_cast<size_t>(std::max(pad / 2, 0)), fill);
  std::string right(static_cast<size_t>(std::max(pad - pad / 2, 0)), fill);
  absl::StrAppend(&out, left, title.empty() ? "" : " ", title, title.empty() ? "" : " ", right,
                  "\n");
}

void Row(std::string& out, const std::string& label, const std::string& value) {
  absl::StrAppend(&out, absl::StrFormat("%-38s%14s\n", label, value));
}

std::string Fixed(double v) { return absl::StrFormat("%.2f", v); }

void Latencies(std::string& out, const std::string& title, const std::string& name,
               const Distribution& d) {
  Heading(out, title, '-');
  Row(out, absl::StrCat("Mean ", name, " (ms):"), Fixed(d.mean_ms));
  Row(out, absl::StrCat("Median ", name, " (ms):"), Fixed(d.p50_ms));
  Row(out, absl::StrCat("P90 ", name, " (ms):"), Fixed(d.p90_ms));
  Row(out, absl::StrCat("P99 ", name, " (ms):"), Fixed(d.p99_ms));
}

std::string RateText(double rate) { return std::isinf(rate) ? "inf" : Fixed(rate); }

nlohmann::json DistributionJson(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean_ms}, {"p50", d.p50_ms},
          {"p90", d.p90_ms},  {"p99", d.p99_ms},   {"max", d.max_ms}};
}

}  // namespace

std::string FormatTable(const BenchSummary& s, const RunDescription& run) {
  std::string out;
  Heading(out, "Serving Benchmark Result", '=');
  if (!run.model.empty()) Row(out, "Model:", run.model);
  Row(out, "Request rate (req/s):", RateText(run.request_rate));
  Row(out, "Max concurrency:",
      run.max_concurrency > 0 ? absl::StrCat(run.max_concurrency) : "unlimited");
  Row(out, "Successful requests:", absl::StrCat(s.completed));
  Row(out, "Failed requests:", absl::StrCat(s.failed));
  for (const auto& [code, count] : s.failures_by_code) {
    Row(out, absl::StrCat("  ", code, ":"), absl::StrCat(count));
  }
  Row(out, "Benchmark duration (s):", Fixed(s.duration_s));
  Row(out, "Total input tokens:", absl::StrCat(s.total_prompt_tokens));
  Row(out, "Total generated tokens:", absl::StrCat(s.total_completion_tokens));
  Row(out, "Request throughput (req/s):", Fixed(s.request_throughput));
  if (s.goodput.has_value()) Row(out, "Request goodput (req/s):", Fixed(*s.goodput));
  Row(out, "Output token throughput (tok/s):", Fixed(s.output_throughput));
  Row(out, "Total token throughput (tok/s):", Fixed(s.total_token_throughput));
  Latencies(out, "Time to First Token", "TTFT", s.ttft);
  Latencies(out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot);
  Latencies(out, "Inter-token Latency", "ITL", s.itl);
  Latencies(out, "End-to-end Latency", "E2EL", s.e2e);
  Heading(out, "", '-');
  Row(out, "P99 send delay vs schedule (ms):", Fixed(s.send_delay.p99_ms));
  Heading(out, "", '=');
  if (!s.first_error.empty()) absl::StrAppend(&out, "First failure: ", s.first_error, "\n");
  return out;
}

nlohmann::json ToJson(const BenchSummary& s, const RunDescription& run) {
  nlohmann::json config = {{"addr", run.addr},
                           {"model", run.model},
                           {"dataset", run.dataset},
                           {"max_concurrency", run.max_concurrency},
                           {"seed", run.seed}};
  // JSON has no infinity; "inf" says "all at once" as the flag does.
  if (std::isinf(run.request_rate)) {
    config["request_rate"] = "inf";
  } else {
    config["request_rate"] = run.request_rate;
  }
  if (run.slo.ttft_ms) config["slo_ttft_ms"] = *run.slo.ttft_ms;
  if (run.slo.tpot_ms) config["slo_tpot_ms"] = *run.slo.tpot_ms;
  nlohmann::json j = {{"config", config},
                      {"num_requests", s.num_requests},
                      {"completed", s.completed},
                      {"failed", s.failed},
                      {"failures_by_code", s.failures_by_code},
                      {"first_error", s.first_error},
                      {"duration_s", s.duration_s},
                      {"total_input_tokens", s.total_prompt_tokens},
                      {"total_output_tokens", s.total_completion_tokens},
                      {"request_throughput", s.request_throughput},
                      {"output_throughput", s.output_throughput},
                      {"total_token_throughput", s.total_token_throughput},
                      {"ttft_ms", DistributionJson(s.ttft)},
                      {"tpot_ms", DistributionJson(s.tpot)},
                      {"itl_ms", DistributionJson(s.itl)},
                      {"e2e_ms", DistributionJson(s.e2e)},
                      {"send_delay_ms", DistributionJson(s.send_delay)}};
  if (s.goodput.has_value()) {
    j["goodput"] = *s.goodput;
    j["good_requests"] = *s.good_requests;
  }
  return j;
}

absl::Status WriteJsonReport(const std::string& path, const BenchSummary& summary,
                             const RunDescription& run) {
  // Server error messages are not guaranteed UTF-8; replace bad bytes rather than throw.
  std::string text =
      ToJson(summary, run).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  text.push_back('\n');
  return WriteStringToFile(path, text);
}

}  // namespace tandem::bench
