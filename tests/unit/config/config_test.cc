#include "common/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/config/config_schema.h"

namespace tandem::config {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TandemConfig Parse(const std::string& yaml) {
  auto c = ParseConfig(yaml, "test.yaml");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.value_or(TandemConfig{});
}

std::string Error(const std::string& yaml) {
  auto c = ParseConfig(yaml, "test.yaml");
  EXPECT_FALSE(c.ok()) << "accepted:\n" << yaml;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

TEST(ConfigTest, EmptyDocumentGivesDefaults) {
  EXPECT_EQ(ToYaml(Parse("")), ToYaml(TandemConfig{}));
  EXPECT_EQ(ToYaml(Parse("# only a comment\n")), ToYaml(TandemConfig{}));
  EXPECT_EQ(Parse("").kv_cache.block_size, 16);
  EXPECT_DOUBLE_EQ(Parse("").balancer.hit_rate_threshold, 0.90);
}

TEST(ConfigTest, ReadsEverySectionAndTheSeedBlockVerbatim) {
  TandemConfig c = Parse(R"(
model: {path: /models/llama, weight_memory: mmap, threads: 2}
kv_cache:
  block_size: 32
  dtype: fp16
  memory_bytes: 512MiB
  enable_prefix_caching: false
router:
  listen: 0.0.0.0:8000
  prefill_workers: [p0:9000, p1:9000]
balancer: {hit_rate_threshold: 0.85, window_seconds: 10}
cache_store: {capacity_bytes: 2GiB, shards: ["s0:7000"]}
kv_cache_optimization:
  enabled: true
  pruning: {start_layer: 25, keep_every: 8}
  protection: {high_frequency_tokens: 100}
  min_batch_size: 8
)");
  EXPECT_EQ(c.model.path, "/models/llama");
  EXPECT_EQ(c.model.weight_memory, "mmap");
  EXPECT_EQ(c.model.threads, 2);
  EXPECT_EQ(c.kv_cache.block_size, 32);
  EXPECT_EQ(c.kv_cache.dtype, "fp16");
  EXPECT_EQ(c.kv_cache.memory_bytes, int64_t{512} << 20);
  EXPECT_FALSE(c.kv_cache.enable_prefix_caching);
  EXPECT_EQ(c.router.listen, "0.0.0.0:8000");
  EXPECT_EQ(c.router.prefill_workers, (std::vector<std::string>{"p0:9000", "p1:9000"}));
  EXPECT_DOUBLE_EQ(c.balancer.hit_rate_threshold, 0.85);
  EXPECT_DOUBLE_EQ(c.balancer.window_seconds, 10);
  EXPECT_EQ(c.cache_store.capacity_bytes, int64_t{2} << 30);
  EXPECT_EQ(c.cache_store.shards, (std::vector<std::string>{"s0:7000"}));
  EXPECT_TRUE(c.kv_cache_optimization.enabled);
  EXPECT_EQ(c.kv_cache_optimization.pruning_start_layer, 25);
  EXPECT_EQ(c.kv_cache_optimization.pruning_keep_every, 8);
  EXPECT_EQ(c.kv_cache_optimization.protection_high_frequency_tokens, 100);
  EXPECT_EQ(c.kv_cache_optimization.min_batch_size, 8);
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.scheduler.max_num_seqs, TandemConfig{}.scheduler.max_num_seqs);
}

TEST(ConfigTest, UnknownKeysAreNamedWithTheKnownOnes) {
  EXPECT_THAT(Error("kv_cache:\n  blok_size: 8\n"),
              AllOf(HasSubstr("test.yaml"), HasSubstr("kv_cache.blok_size"),
                    HasSubstr("unknown key"), HasSubstr("block_size")));
  EXPECT_THAT(Error("routr: {listen: x}\n"), AllOf(HasSubstr("routr"), HasSubstr("router")));
  EXPECT_THAT(Error("kv_cache_optimization: {pruning: {start: 3}}\n"),
              HasSubstr("kv_cache_optimization.pruning.start"));
}

TEST(ConfigTest, WrongTypesAndRangesAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {"kv_cache: {block_size: abc}", "kv_cache.block_size"},
      {"kv_cache: {block_size: 0}", "kv_cache.block_size"},
      {"kv_cache: {block_size: 2.5}", "kv_cache.block_size"},
      {"kv_cache: {block_size: [1]}", "kv_cache.block_size"},
      {"kv_cache: {dtype: int3}", "kv_cache.dtype"},
      {"kv_cache: {memory_bytes: lots}", "kv_cache.memory_bytes"},
      {"kv_cache: {memory_bytes: -5}", "kv_cache.memory_bytes"},
      {"kv_cache: {memory_bytes: 99999999999TiB}", "kv_cache.memory_bytes"},
      {"kv_cache: {enable_prefix_caching: yes}", "kv_cache.enable_prefix_caching"},
      {"balancer: {hit_rate_threshold: 1.5}", "balancer.hit_rate_threshold"},
      {"balancer: {window_seconds: nan}", "balancer.window_seconds"},
      {"router: {prefill_workers: a:1}", "router.prefill_workers"},
      {"router: {prefill_workers: [[a]]}", "router.prefill_workers"},
      {"kv_cache: 5", "kv_cache"},
      {"model: {path: {nested: 1}}", "model.path"},
  };
  for (const auto& [yaml, key] : cases) {
    EXPECT_THAT(Error(yaml), HasSubstr(key)) << yaml;
  }
}

// Found by the config fuzzer: such values printed as YAML that read back differently.
TEST(ConfigTest, ValuesMustBeUtf8WithoutControlCharacters) {
  EXPECT_THAT(Error(std::string("model: {path: \"/a\\0b\"}")),
              AllOf(HasSubstr("model.path"), HasSubstr("control character U+0000")));
  EXPECT_THAT(Error("model: {path: \"a\\u0085b\"}"), HasSubstr("U+0085"));
  EXPECT_THAT(Error("model: {path: \"a\\u2028b\"}"), HasSubstr("U+2028"));
  EXPECT_THAT(Error("model: {path: /mod\xff\xff"
                    "els}"),
              AllOf(HasSubstr("model.path"), HasSubstr("UTF-8")));
  EXPECT_THAT(Error("router: {prefill_workers: [\"a\\tb:1\"]}"),
              HasSubstr("router.prefill_workers"));
  EXPECT_EQ(Parse("model: {path: /modèles/小}").model.path, "/modèles/小");
}

TEST(ConfigTest, SyntaxErrorsGiveTheLine) {
  EXPECT_THAT(Error("model:\n  path: [unclosed\n"), HasSubstr("test.yaml:"));
  EXPECT_THAT(Error("- a\n- b\n"), HasSubstr("top level"));
}

TEST(ConfigTest, CrossKeyChecks) {
  EXPECT_THAT(Error("scheduler: {chunk_size: 4096, max_num_batched_tokens: 1024}"),
              HasSubstr("scheduler.chunk_size"));
  EXPECT_THAT(Error("balancer: {hit_rate_threshold: 0.99, hysteresis: 0.05}"),
              HasSubstr("balancer.hysteresis"));
  EXPECT_THAT(Error("planner: {profile: p.json}"), HasSubstr("planner.slo_ttft_ms"));
  EXPECT_EQ(Parse("planner: {profile: p.json, slo_tpot_ms: 50}").planner.slo_tpot_ms, 50);
  EXPECT_THAT(Error("kv_cache_optimization: {pruning: {start_layer: 4, ratio: 0.33}}"),
              HasSubstr("kv_cache_optimization.pruning.ratio"));
  EXPECT_DOUBLE_EQ(
      Parse("kv_cache_optimization: {pruning: {ratio: 0.33}}").kv_cache_optimization.pruning_ratio,
      0.33);
}

TEST(ConfigTest, OverridesUseTheSameChecks) {
  TandemConfig c;
  ASSERT_TRUE(ApplyOverride(c, "kv_cache.block_size=32").ok());
  EXPECT_EQ(c.kv_cache.block_size, 32);
  ASSERT_TRUE(ApplyOverride(c, "router.decode_workers=[d0:1, d1:2]").ok());
  EXPECT_EQ(c.router.decode_workers, (std::vector<std::string>{"d0:1", "d1:2"}));
  ASSERT_TRUE(ApplyOverride(c, "kv_cache_optimization.pruning.start_layer=3").ok());
  EXPECT_EQ(c.kv_cache_optimization.pruning_start_layer, 3);

  const std::string before = ToYaml(c);
  EXPECT_THAT(ApplyOverride(c, "kv_cache.block_size=huge").message(),
              HasSubstr("kv_cache.block_size"));
  EXPECT_THAT(ApplyOverride(c, "kv_cache.nope=1").message(), HasSubstr("kv_cache.nope"));
  EXPECT_THAT(ApplyOverride(c, "block_size").message(), HasSubstr("key=value"));
  EXPECT_THAT(ApplyOverride(c, "scheduler.chunk_size=100000").message(),
              HasSubstr("max_num_batched_tokens"));
  EXPECT_EQ(ToYaml(c), before);  // failed overrides change nothing
}

// The checks that span keys run after every override, whatever their order; an error leaves
// the config as it was.
TEST(ConfigTest, OverridesAreCheckedTogether) {
  TandemConfig c;
  const std::vector<std::string> smaller = {"scheduler.max_num_batched_tokens=256",
                                            "scheduler.chunk_size=256"};
  ASSERT_TRUE(ApplyOverrides(c, smaller).ok());
  EXPECT_EQ(c.scheduler.max_num_batched_tokens, 256);
  EXPECT_EQ(c.scheduler.chunk_size, 256);
  const std::vector<std::string> bad = {"kv_cache.block_size=32",
                                        "scheduler.max_num_batched_tokens=64"};
  const absl::Status s = ApplyOverrides(c, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("exceeds scheduler.max_num_batched_tokens (64)"));
  EXPECT_EQ(c.kv_cache.block_size, 16);  // unchanged
  EXPECT_EQ(c.scheduler.max_num_batched_tokens, 256);
}

TEST(ConfigTest, YamlOutputParsesBackToTheSameConfig) {
  TandemConfig c;
  c.model.path = "a \"quoted\" path\\x";
  c.router.prefill_workers = {"p:1", "q:2"};
  c.kv_cache.memory_bytes = 12345678;
  c.balancer.hit_rate_threshold = 0.8;
  c.kv_cache_optimization.enabled = true;
  const std::string yaml = ToYaml(c);
  EXPECT_EQ(ToYaml(Parse(yaml)), yaml);
  EXPECT_EQ(Parse(yaml).model.path, c.model.path);
}

TEST(ConfigTest, TlsFilesComeTogether) {
  auto c = ParseConfig("security:\n  tls:\n    ca_file: /etc/tandem/ca.pem\n", "t.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("give ca_file, cert_file and key_file together"));
  c = ParseConfig("security:\n  tls: {ca_file: a, cert_file: b, key_file: c}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->security.tls.key_file, "c");
  EXPECT_FALSE(c->security.allow_insecure);
}

// UCX moves KV bytes unencrypted: under TLS it needs the operator's explicit word, and any
// value but the four transports is refused naming the key.
TEST(ConfigTest, TheUcxFabricUnderTlsNeedsItsOptIn) {
  const std::string tls = "security:\n  tls: {ca_file: a, cert_file: b, key_file: c}\n";
  auto c = ParseConfig(tls + "cache_store:\n  transport: ucx\n", "t.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("cache_store.transport"));
  EXPECT_THAT(c.status().message(), HasSubstr("allow_unencrypted_kv_fabric"));
  c = ParseConfig(tls + "  allow_unencrypted_kv_fabric: true\ncache_store:\n  transport: ucx\n",
                  "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cache_store.transport, "ucx");
  EXPECT_TRUE(ParseConfig(tls + "cache_store:\n  transport: auto\n", "t.yaml").ok());
  EXPECT_TRUE(ParseConfig("cache_store:\n  transport: ucx\n", "t.yaml").ok());
  c = ParseConfig("cache_store:\n  transport: rdma\n", "t.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("cache_store.transport"));
}

TEST(ConfigTest, EveryKeyIsDocumented) {
  const std::string md = ConfigReferenceMarkdown();
  for (const auto& field : internal::Schema()) {
    EXPECT_THAT(md, HasSubstr("`" + field.key + "`"));
    EXPECT_FALSE(field.doc.empty()) << field.key;
  }
  // docs/configuration.md carries the generated reference verbatim.
  std::ifstream doc(std::string(TANDEM_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(doc.good()) << "docs/configuration.md is missing";
  std::stringstream text;
  text << doc.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr(md))
      << "docs/configuration.md is out of date: regenerate its reference with "
         "`tandem config --reference`";
}

}  // namespace
}  // namespace tandem::config
