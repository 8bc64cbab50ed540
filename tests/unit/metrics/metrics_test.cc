#include "common/metrics/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <string>

#include "common/metrics/token_timing.h"

namespace tandem::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A plain HTTP/1.0 GET over a loopback socket, as a scraper does it.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, n);
  close(fd);
  return out;
}

TEST(MetricsTest, EveryDesignMetricIsExportedWithItsLabels) {
  Metrics m;
  RoleMetrics decode = m.ForRole("decode");
  decode.kv_lookup_hits->Increment(9);
  decode.kv_lookup_memory_hits->Increment(3);
  decode.kv_lookup_disk_hits->Increment(2);
  decode.kv_lookup_misses->Increment();
  decode.time_to_first_token->Observe(0.25);
  decode.finished_length->Increment();
  m.balancer().reschedules->Increment();
  const std::string text = m.Serialize();
  for (const char* name :
       {"tandem_time_to_first_token_seconds", "tandem_inter_token_latency_seconds",
        "tandem_e2e_request_latency_seconds", "tandem_request_queue_time_seconds",
        "tandem_prefill_time_seconds", "tandem_decode_time_seconds", "tandem_kv_transfer_seconds",
        "tandem_kv_transfer_bytes_total", "tandem_kv_cache_usage_ratio", "tandem_kv_lookups_total",
        "tandem_decode_kv_hit_ratio", "tandem_balancer_reschedules_total",
        "tandem_requests_running", "tandem_requests_waiting", "tandem_prompt_tokens_total",
        "tandem_generation_tokens_total", "tandem_requests_total", "tandem_pruned_layers"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + name)) << name;
  }
  EXPECT_THAT(
      text, HasSubstr("tandem_kv_lookups_total{result=\"hit\",role=\"decode\",tier=\"worker\"} 9"));
  EXPECT_THAT(
      text, HasSubstr("tandem_kv_lookups_total{result=\"hit\",role=\"decode\",tier=\"memory\"} 3"));
  EXPECT_THAT(text,
              HasSubstr("tandem_kv_lookups_total{result=\"hit\",role=\"decode\",tier=\"disk\"} 2"));
  EXPECT_THAT(text, HasSubstr("tandem_kv_lookups_total{result=\"miss\",role=\"decode\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_requests_total{finish_reason=\"length\",role=\"decode\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_time_to_first_token_seconds_count{role=\"decode\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_balancer_reschedules_total 1"));
}

// The engine loop's series, as a worker's agent advances them.
TEST(MetricsTest, EngineLoopSeriesByRoleAndPart) {
  Metrics m;
  RoleMetrics decode = m.ForRole("decode");
  decode.engine_steps->Increment(3);
  decode.engine_step_sequences->Increment(7);
  decode.engine_output_seconds->Increment(0.5);
  const std::string text = m.Serialize();
  EXPECT_THAT(text, HasSubstr("tandem_engine_steps_total{role=\"decode\"} 3"));
  EXPECT_THAT(text, HasSubstr("tandem_engine_step_sequences_total{role=\"decode\"} 7"));
  EXPECT_THAT(text,
              HasSubstr("tandem_engine_loop_seconds_total{part=\"outputs\",role=\"decode\"} 0.5"));
  EXPECT_THAT(text, HasSubstr("tandem_engine_loop_seconds_total{part=\"step\",role=\"decode\"} 0"));
  EXPECT_THAT(text, HasSubstr("# TYPE tandem_engine_step_cpu_seconds_total counter"));
}

// TTFT once from the arrival; then a chunk of k tokens counts k gaps of gap / k, and the rest
// of a first chunk counts gaps of 0, so the mean stays the time per output token.
TEST(MetricsTest, TokenTimingCountsEveryTokenGap) {
  using Clock = TokenTiming::Clock;
  const Clock::time_point t0{};
  prometheus::Histogram ttft({0.5, 1, 2, 4}), itl({0.1, 0.2, 0.4, 1});
  TokenTiming timing(t0);
  timing.Add(0, t0 + std::chrono::seconds(1), &ttft, &itl);  // no tokens: nothing
  EXPECT_FALSE(timing.first_token_at().has_value());
  timing.Add(3, t0 + std::chrono::seconds(2), &ttft, &itl);
  timing.Add(1, t0 + std::chrono::milliseconds(2300), &ttft, &itl);
  timing.Add(4, t0 + std::chrono::milliseconds(2700), nullptr, &itl);
  EXPECT_EQ(timing.first_token_at(), t0 + std::chrono::seconds(2));
  const prometheus::ClientMetric first = ttft.Collect();
  EXPECT_EQ(first.histogram.sample_count, 1u);
  EXPECT_DOUBLE_EQ(first.histogram.sample_sum, 2.0);
  const prometheus::ClientMetric gaps = itl.Collect();
  EXPECT_EQ(gaps.histogram.sample_count, 2u + 1u + 4u);  // 8 tokens: 7 gaps
  EXPECT_NEAR(gaps.histogram.sample_sum, 0.3 + 0.4, 1e-9);
  EXPECT_EQ(gaps.histogram.bucket[0].cumulative_count, 2u + 4u);  // the zeros and the 0.1s
}

TEST(MetricsTest, OnlyARouterExportsBalancerAndPoolMetrics) {
  Metrics worker;
  worker.ForRole("decode").requests_running->Set(1);
  EXPECT_THAT(worker.Serialize(), Not(HasSubstr("tandem_workers")));
  EXPECT_THAT(worker.Serialize(), Not(HasSubstr("tandem_balancer_state")));
  Metrics colocated;
  colocated.balancer(/*colocated=*/true).decode_workers->Set(3);
  EXPECT_EQ(colocated.balancer().prefill_workers, nullptr);  // the first call decided
  EXPECT_THAT(colocated.Serialize(), HasSubstr("tandem_workers{pool=\"decode\"} 3"));
  EXPECT_THAT(colocated.Serialize(), Not(HasSubstr("pool=\"prefill\"")));
}

TEST(MetricsTest, StoreShardsAreLabelledByAddress) {
  Metrics m;
  StoreMetrics a = m.ForShard("10.0.0.1:7000");
  StoreMetrics b = m.ForShard("10.0.0.2:7000", {.disk = true, .fabric = true});
  a.used_bytes->Set(4096);
  a.hits->Increment(3);
  b.aborted->Increment();
  b.disk.used_bytes->Set(8192);
  b.disk.read_seconds->Observe(0.001);
  b.fabric.get.refused->Increment(2);
  b.fabric.put.bytes->Increment(1 << 20);
  EXPECT_EQ(a.disk.used_bytes, nullptr);  // no disk tier, no series
  EXPECT_EQ(a.fabric.get.refused, nullptr);  // no fabric, no series
  const std::string text = m.Serialize();
  EXPECT_THAT(text,
              HasSubstr("tandem_cache_store_used_bytes{shard=\"10.0.0.1:7000\",tier=\"memory\"} "
                        "4096"));
  EXPECT_THAT(
      text, HasSubstr("tandem_cache_store_used_bytes{shard=\"10.0.0.2:7000\",tier=\"disk\"} 8192"));
  EXPECT_THAT(
      text, Not(HasSubstr("tandem_cache_store_used_bytes{shard=\"10.0.0.1:7000\",tier=\"disk\"}")));
  EXPECT_THAT(text,
              HasSubstr("tandem_cache_store_disk_io_seconds_count{op=\"read\",shard=\"10.0.0.2:"
                        "7000\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_cache_store_fabric_messages_total{direction=\"get\","
                              "outcome=\"refused\",shard=\"10.0.0.2:7000\"} 2"));
  EXPECT_THAT(text, HasSubstr("tandem_cache_store_fabric_bytes_total{direction=\"put\","
                              "shard=\"10.0.0.2:7000\"} 1048576"));
  EXPECT_THAT(text, Not(HasSubstr("tandem_cache_store_fabric_bytes_total{direction=\"put\","
                                  "shard=\"10.0.0.1:7000\"}")));
  EXPECT_THAT(text,
              HasSubstr("tandem_cache_store_tier_lookups_total{result=\"miss\",shard=\"10.0.0.2:"
                        "7000\",tier=\"disk\"} 0"));
  EXPECT_THAT(
      text,
      HasSubstr("tandem_cache_store_lookups_total{result=\"hit\",shard=\"10.0.0.1:7000\"} 3"));
  EXPECT_THAT(
      text,
      HasSubstr("tandem_cache_store_puts_total{outcome=\"aborted\",shard=\"10.0.0.2:7000\"} 1"));
  EXPECT_THAT(text, HasSubstr("tandem_cache_store_evictions_total{shard=\"10.0.0.2:7000\",tier="
                              "\"memory\"} 0"));
}

TEST(MetricsTest, ComputeTurnsByDeviceAndPhase) {
  Metrics m;
  EXPECT_THAT(m.Serialize(), Not(HasSubstr("tandem_compute_turns_total{")));
  Metrics::ComputeTurn decode = m.ComputeTurns("cpu", "decode");
  decode.turns->Increment(3);
  decode.wait_seconds->Increment(0.25);
  const std::string text = m.Serialize();
  EXPECT_THAT(text, HasSubstr("tandem_compute_turns_total{device=\"cpu\",phase=\"decode\"} 3"));
  EXPECT_THAT(
      text,
      HasSubstr("tandem_compute_turn_wait_seconds_total{device=\"cpu\",phase=\"decode\"} 0.25"));
}

TEST(MetricsTest, DeviceMemoryOnlyForWorkersThatAskForIt) {
  Metrics m;
  m.ForRole("decode");
  EXPECT_THAT(m.Serialize(), Not(HasSubstr("tandem_device_memory_bytes{")));
  m.DeviceMemory("prefill", "weights")->Set(2.5e9);
  m.DeviceMemory("prefill", "kv_cache")->Set(1 << 30);
  const std::string text = m.Serialize();
  EXPECT_THAT(text,
              HasSubstr("tandem_device_memory_bytes{role=\"prefill\",use=\"weights\"} 2500000000"));
  EXPECT_THAT(
      text, HasSubstr("tandem_device_memory_bytes{role=\"prefill\",use=\"kv_cache\"} 1073741824"));
}

TEST(MetricsTest, CpuGemmInfoLabelsTheProviderAndIsa) {
  Metrics m;
  EXPECT_THAT(m.Serialize(), Not(HasSubstr("tandem_cpu_gemm_info{")));
  m.CpuGemmInfo("decode", "onednn", "avx512_core_amx");
  EXPECT_THAT(m.Serialize(),
              HasSubstr("tandem_cpu_gemm_info{isa=\"avx512_core_amx\",provider=\"onednn\","
                        "role=\"decode\"} 1"));
}

TEST(MetricsTest, ServedOverHttp) {
  Metrics m;
  m.ForRole("router").prompt_tokens->Increment(42);
  auto server = MetricsServer::Start("127.0.0.1:0", m);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string body = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(body, HasSubstr("200 OK"));
  EXPECT_THAT(body, HasSubstr("tandem_prompt_tokens_total{role=\"router\"} 42"));
}

// The value of `name{role="serve"}` in an exposition, or -1.
double Sample(const std::string& text, const std::string& name) {
  const std::string key = name + "{role=\"serve\"} ";
  const size_t at = text.find("\n" + key);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + 1 + key.size()));
}

// /proc/self/status's VmRSS, bytes: a second reading of resident memory.
double StatusRssBytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024;
  }
  return -1;
}

TEST(MetricsTest, ProcessMetricsFollowTheProcess) {
  Metrics m("serve");
  // Burn some CPU so the counter has something to show.
  volatile double sink = 0;
  for (int i = 0; i < 20'000'000; ++i) sink = sink + i * 1e-9;
  const double rss_before = StatusRssBytes();
  const std::string text = m.Serialize();
  const double rss_after = StatusRssBytes();
  EXPECT_THAT(text, HasSubstr("# TYPE process_cpu_seconds_total counter"));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
                     usage.ru_stime.tv_usec * 1e-6;
  EXPECT_GT(Sample(text, "process_cpu_seconds_total"), 0);
  EXPECT_NEAR(Sample(text, "process_cpu_seconds_total"), cpu, 0.05);
  // Resident memory moves between readings, and the kernel batches RSS counts per thread (up to
  // 64 pages each before they reach the totals /proc reports): bracket the sample loosely.
  const double slack = 1024 * 1024;
  EXPECT_GE(Sample(text, "process_resident_memory_bytes"), std::min(rss_before, rss_after) - slack);
  EXPECT_LE(Sample(text, "process_resident_memory_bytes"), std::max(rss_before, rss_after) + slack);
  EXPECT_GT(Sample(text, "process_virtual_memory_bytes"), rss_after);
  EXPECT_GE(Sample(text, "process_open_fds"), 3);  // stdin, stdout, stderr
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_GT(Sample(text, "process_start_time_seconds"), now - 3600);
  EXPECT_LE(Sample(text, "process_start_time_seconds"), now + 1);
  // Without a role there are no process metrics.
  EXPECT_THAT(Metrics().Serialize(), Not(HasSubstr("process_cpu_seconds_total")));
}

TEST(MetricsTest, BadListenAddressIsAnError) {
  Metrics m;
  EXPECT_FALSE(MetricsServer::Start("not an address", m).ok());
}

}  // namespace
}  // namespace tandem::metrics
