#include "common/config/config_schema.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/util/cli_args.h"
#include "common/util/status_macros.h"
#include "common/util/utf8.h"

namespace tandem::config::internal {
namespace {

// Read-only use of an accessor written for a mutable config.
template <typename Ref>
auto& Get(Ref ref, const TandemConfig& c) {
  return ref(const_cast<TandemConfig&>(c));
}

// A scalar's text. Text must be UTF-8 without control characters, so that every accepted
// value prints back as YAML that reads the same (and no path or address hides a NUL).
absl::StatusOr<std::string> Scalar(const YAML::Node& node, const std::string& want) {
  if (!node.IsScalar()) return absl::InvalidArgumentError(absl::StrCat("expected ", want));
  const std::string& text = node.Scalar();
  TANDEM_RETURN_IF_ERROR(ValidateUtf8(text));
  // C0 and C1 controls, and the Unicode line and paragraph separators (YAML folds them).
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    const char32_t cp = DecodeUtf8(text, &i);
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029) {
      return absl::InvalidArgumentError(absl::StrCat(
          "control character U+", absl::Hex(static_cast<uint32_t>(cp), absl::kZeroPad4),
          " at byte ", at, " of a value"));
    }
  }
  return text;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

template <typename Ref>
Field Int(std::string key, Ref ref, int64_t lo, int64_t hi, std::string doc) {
  std::string type = absl::StrCat("integer in [", lo, ", ", hi, "]");
  return {key, type, std::move(doc),
          [ref, lo, hi, type](TandemConfig& c, const YAML::Node& node) -> absl::Status {
            auto text = Scalar(node, type);
            if (!text.ok()) return text.status();
            int64_t v = 0;
            if (!absl::SimpleAtoi(*text, &v) || v < lo || v > hi) {
              return absl::InvalidArgumentError(
                  absl::StrCat("expected an ", type, ", got '", *text, "'"));
            }
            ref(c) = static_cast<std::remove_reference_t<decltype(ref(c))>>(v);
            return absl::OkStatus();
          },
          [ref](const TandemConfig& c) { return absl::StrCat(Get(ref, c)); }};
}

template <typename Ref>
Field Bytes(std::string key, Ref ref, int64_t lo, std::string doc) {
  std::string type = absl::StrCat("bytes >= ", lo, " (e.g. 1073741824, 1GiB, 512MiB, 16G)");
  return {key, type, std::move(doc),
          [ref, lo, type](TandemConfig& c, const YAML::Node& node) -> absl::Status {
            auto text = Scalar(node, type);
            if (!text.ok()) return text.status();
            auto v = ParseByteSize(*text);
            if (!v.ok()) return v.status();
            if (*v < lo) return absl::InvalidArgumentError(absl::StrCat("expected ", type));
            ref(c) = *v;
            return absl::OkStatus();
          },
          [ref](const TandemConfig& c) { return absl::StrCat(Get(ref, c)); }};
}

template <typename Ref>
Field Real(std::string key, Ref ref, double lo, double hi, std::string doc) {
  std::string type = absl::StrCat("number in [", lo, ", ", hi, "]");
  return {key, type, std::move(doc),
          [ref, lo, hi, type](TandemConfig& c, const YAML::Node& node) -> absl::Status {
            auto text = Scalar(node, type);
            if (!text.ok()) return text.status();
            double v = 0;
            if (!absl::SimpleAtod(*text, &v) || !std::isfinite(v) || v < lo || v > hi) {
              return absl::InvalidArgumentError(
                  absl::StrCat("expected a ", type, ", got '", *text, "'"));
            }
            ref(c) = v;
            return absl::OkStatus();
          },
          [ref](const TandemConfig& c) { return absl::StrCat(Get(ref, c)); }};
}

template <typename Ref>
Field Bool(std::string key, Ref ref, std::string doc) {
  return {key, "true or false", std::move(doc),
          [ref](TandemConfig& c, const YAML::Node& node) -> absl::Status {
            auto text = Scalar(node, "true or false");
            if (!text.ok()) return text.status();
            if (*text != "true" && *text != "false") {
              return absl::InvalidArgumentError(
                  absl::StrCat("expected true or false, got '", *text, "'"));
            }
            ref(c) = *text == "true";
            return absl::OkStatus();
          },
          [ref](const TandemConfig& c) { return std::string(Get(ref, c) ? "true" : "false"); }};
}

// A string; `choices` empty means any string.
template <typename Ref>
Field Str(std::string key, Ref ref, std::vector<std::string> choices, std::string doc) {
  std::string type = choices.empty() ? "string" : "one of: " + absl::StrJoin(choices, ", ");
  return {
      key, type, std::move(doc),
      [ref, choices, type](TandemConfig& c, const YAML::Node& node) -> absl::Status {
        auto text = Scalar(node, type);
        if (!text.ok()) return text.status();
        if (!choices.empty() && std::find(choices.begin(), choices.end(), *text) == choices.end()) {
          return absl::InvalidArgumentError(absl::StrCat("expected ", type, ", got '", *text, "'"));
        }
        ref(c) = *text;
        return absl::OkStatus();
      },
      [ref](const TandemConfig& c) { return Quote(Get(ref, c)); }};
}

template <typename Ref>
Field List(std::string key, Ref ref, std::string doc) {
  return {key, "list of strings", std::move(doc),
          [ref](TandemConfig& c, const YAML::Node& node) -> absl::Status {
            if (!node.IsSequence()) return absl::InvalidArgumentError("expected a list");
            std::vector<std::string> out;
            for (const YAML::Node& item : node) {
              TANDEM_ASSIGN_OR_RETURN(std::string text, Scalar(item, "a list of strings"));
              out.push_back(std::move(text));
            }
            ref(c) = std::move(out);
            return absl::OkStatus();
          },
          [ref](const TandemConfig& c) {
            std::vector<std::string> quoted;
            for (const std::string& s : Get(ref, c)) quoted.push_back(Quote(s));
            return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
          }};
}

#define TANDEM_CONFIG_REF(path) \
  [](TandemConfig & c) -> auto& { return c.path; }

std::vector<Field> MakeSchema() {
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  const std::string listen_doc = "host:port to serve gRPC on; port 0 picks a free port";
  const std::string advertise_doc =
      "address the router reaches this worker at: host:port, or a host alone (a name, IPv4 or "
      "bare IPv6 literal such as a pod IP) that takes the listen port; empty: the bound listen "
      "address";
  return {
      Str("model.path", TANDEM_CONFIG_REF(model.path), {},
          "Hugging Face model directory (config.json, safetensors, tokenizer.json)"),
      Str("model.name", TANDEM_CONFIG_REF(model.name), {},
          "name reported by GetModelInfo; empty: the directory's name"),
      Str("model.weight_memory", TANDEM_CONFIG_REF(model.weight_memory), {"hugepages", "mmap"},
          "hugepages copies the matrices into 2 MiB pages packed for the GEMM kernels (faster "
          "decode and prefill, batch-invariant results); mmap uses the safetensors files in "
          "place (no copy, instant start)"),
      Str("model.weight_quantization", TANDEM_CONFIG_REF(model.weight_quantization),
          {"none", "int8", "int4"},
          "quantize the decoder layers' matrices of a float checkpoint at load (round to "
          "nearest, as GPTQ defines it; the embedding and norms keep their dtype, and lm_head "
          "unless model.lm_head_quantization): "
          "int8 stores those matrices in about half of bf16's bytes, int4 in about a quarter "
          "plus its scales; CPU only. Every role of a deployment needs the same setting"),
      Int("model.weight_quantization_group_size",
          TANDEM_CONFIG_REF(model.weight_quantization_group_size), -1, 256,
          "input columns per scale of model.weight_quantization: -1 for one scale per output "
          "row, or 16, 32, 64, 128, 256; 0: the format's default (int8: -1, int4: 128)"),
      Str("model.activation_quantization", TANDEM_CONFIG_REF(model.activation_quantization),
          {"none", "int8", "int8-token"},
          "int8 rounds the input of every quantized matrix (model.weight_quantization or a "
          "quantized checkpoint) to int8 in blocks of 32 columns, one scale per block, as "
          "llama.cpp does; the products then run on integers (AVX512-VNNI; AVX-VNNI; AVX2 for "
          "int4): "
          "measured 2.4-3.6x the prefill and 1.3-1.4x the batch-1 int4 decode, at a small cost "
          "in accuracy (docs/benchmarks.md). int8-token rounds with one scale per token (row), "
          "as a W8A8 checkpoint always does; on a CPU with AMX-INT8 and model.cpu_gemm auto, "
          "int8 weights with one scale per row then multiply on the AMX tiles. Every role needs "
          "the same setting"),
      Str("model.lm_head_quantization", TANDEM_CONFIG_REF(model.lm_head_quantization),
          {"none", "int8"},
          "int8 quantizes lm_head at load too (one scale per row; a tied embedding keeps its "
          "dtype for the rows it embeds, and lm_head becomes a quantized copy), its input "
          "rounded as model.activation_quantization says: on small models lm_head is most of "
          "what a decode step reads (docs/benchmarks.md); CPU only. Every role needs the same "
          "setting"),
      Str("model.cpu_gemm", TANDEM_CONFIG_REF(model.cpu_gemm), {"auto", "tandem", "onednn"},
          "which GEMMs multiply the float matrices on the CPU: tandem, the own kernels; onednn, "
          "oneDNN's matmul (f32, bf16 and f16 weights; bf16 weights multiply inputs rounded to "
          "bf16; f16 weights are rounded to bf16 where the CPU has bf16 dot products, else "
          "widened to f32) prepacked at load, one oneDNN thread per compute thread; auto, oneDNN "
          "for bf16 and f16 weights where the CPU has bf16 dot products (AVX512-BF16 or AMX), "
          "else the own kernels (measured 2.3-3.4x the prefill and 1.7-2.6x the batched decode "
          "on AVX512-BF16, and 3.6-5.1x the prefill and 2.1-3.9x the batched decode on AMX, "
          "where bf16 slices run on Tandem's own AMX tile kernel with oneDNN's bits; batch 1 "
          "alike on both; on AVX2 oneDNN's f32 GEMMs were no faster; docs/benchmarks.md). "
          "Quantized matrices and an untied embedding stay on the own kernels, except that auto "
          "on a CPU with AMX-INT8 multiplies int8 weights with one scale per row and per-token "
          "int8 activations (a W8A8 checkpoint, or model.activation_quantization: int8-token) "
          "on Tandem's own AMX-INT8 tiles. "
          "The load log line says which was chosen and why"),
      Int("model.threads", TANDEM_CONFIG_REF(model.threads), 0, 1024,
          "compute threads of a role; `tandem serve` shares them between its engines; 0: every "
          "core"),
      Str("model.device", TANDEM_CONFIG_REF(model.device), {},
          "where the model computes: cpu, cuda (device 0) or cuda:N; a CUDA device needs a "
          "binary built with the CUDA backend"),
      Int("kv_cache.block_size", TANDEM_CONFIG_REF(kv_cache.block_size), 1, 1024,
          "tokens per KV block (the unit of paging, prefix caching and transfer)"),
      Str("kv_cache.dtype", TANDEM_CONFIG_REF(kv_cache.dtype),
          {"auto", "fp32", "fp16", "bf16", "int8", "mixed"},
          "element type of the KV cache; auto: the model's weight dtype; int8: one fp16 scale "
          "per token and head (about half of fp16's bytes); mixed: fp16 for the attention-sink "
          "tokens and the recent window, int8 for the rest (kv_cache.mixed)"),
      Bytes("kv_cache.memory_bytes", TANDEM_CONFIG_REF(kv_cache.memory_bytes), 1 << 20,
            "KV cache memory per engine"),
      Bool("kv_cache.enable_prefix_caching", TANDEM_CONFIG_REF(kv_cache.enable_prefix_caching),
           "reuse cached blocks of identical prompt prefixes"),
      Int("kv_cache.mixed.sink_tokens", TANDEM_CONFIG_REF(kv_cache.mixed.sink_tokens), 0, kMaxInt,
          "mixed: the first tokens of every sequence stay fp16 (attention sinks; whole blocks)"),
      Int("kv_cache.mixed.window_tokens", TANDEM_CONFIG_REF(kv_cache.mixed.window_tokens), 0,
          kMaxInt,
          "mixed: the most recent tokens stay fp16; a block that falls wholly behind them is "
          "requantized to int8"),
      Int("kv_cache.mixed.fp16_blocks", TANDEM_CONFIG_REF(kv_cache.mixed.fp16_blocks), 0, kMaxInt,
          "mixed: blocks of kv_cache.memory_bytes kept fp16, the rest int8; 0: room for "
          "scheduler.max_num_seqs windows plus one step of prefill, at most a quarter of the "
          "memory"),
      Str("kv_cache.eviction.policy", TANDEM_CONFIG_REF(kv_cache.eviction.policy),
          {"sliding", "semantic"},
          "sliding: evict the oldest blocks past the sinks, as many as the budget needs; "
          "semantic (the elastic window): evict up to the next topic shift, where the mean keys "
          "of consecutive chunks differ unusually (shift_threshold), keeping at least half the "
          "budget; sliding where there is none"),
      Int("kv_cache.eviction.budget_tokens", TANDEM_CONFIG_REF(kv_cache.eviction.budget_tokens), 0,
          kMaxInt,
          "eviction over long sequences: once a sequence's cache holds more than this, its "
          "oldest whole blocks after the sink tokens are evicted, so new tokens attend to the "
          "sinks and the last ~budget_tokens (positions keep their numbers); 0: off"),
      Int("kv_cache.eviction.sink_tokens", TANDEM_CONFIG_REF(kv_cache.eviction.sink_tokens), 0,
          kMaxInt,
          "eviction: the first tokens of every sequence are never evicted (attention sinks)"),
      Real("kv_cache.eviction.shift_threshold",
           TANDEM_CONFIG_REF(kv_cache.eviction.shift_threshold), 0, 10,
           "semantic: a chunk starts a new segment (a topic shift) where the cosine distance "
           "between its mean key and the previous chunk's (middle layer) exceeds the sequence's "
           "running mean of those distances by this many standard deviations"),
      Int("kv_cache.eviction.chunk_tokens", TANDEM_CONFIG_REF(kv_cache.eviction.chunk_tokens), 1,
          kMaxInt, "semantic: tokens per chunk whose mean key is compared (whole blocks)"),
      Int("scheduler.max_num_seqs", TANDEM_CONFIG_REF(scheduler.max_num_seqs), 1, 65536,
          "sequences running at once per engine"),
      Int("scheduler.max_num_batched_tokens", TANDEM_CONFIG_REF(scheduler.max_num_batched_tokens),
          1, kMaxInt, "tokens per engine step (prefill chunks plus decode tokens)"),
      Int("scheduler.chunk_size", TANDEM_CONFIG_REF(scheduler.chunk_size), 1, kMaxInt,
          "prompt tokens per sequence per step (chunked prefill)"),
      Int("scheduler.stream_interval", TANDEM_CONFIG_REF(scheduler.stream_interval), 1, 1024,
          "tokens a decode worker gathers per streamed message: 1 streams every token; k sends "
          "every k-th (the first and the last at once), k-fold fewer messages and their CPU"),
      Str("router.listen", TANDEM_CONFIG_REF(router.listen), {},
          "host:port of the public Inference API"),
      Str("router.mode", TANDEM_CONFIG_REF(router.mode), {"disaggregated", "colocated"},
          "disaggregated: prefill workers compute the prompt's KV and decode workers continue; "
          "colocated: decode workers run whole requests (chunked prefill mixed into decode "
          "batches), no prefill pool or store needed"),
      Int("router.max_queued_requests", TANDEM_CONFIG_REF(router.max_queued_requests), 1, kMaxInt,
          "requests waiting for a worker before RESOURCE_EXHAUSTED"),
      Int("router.max_queued_tokens", TANDEM_CONFIG_REF(router.max_queued_tokens), 1,
          std::numeric_limits<int64_t>::max(),
          "prompt tokens waiting for prefill before RESOURCE_EXHAUSTED"),
      Real("router.grpc_write_timeout_seconds",
           TANDEM_CONFIG_REF(router.grpc_write_timeout_seconds), 0, 86400,
           "a gRPC Generate stream whose client takes no message for this long (it stopped "
           "reading) is cancelled and its request freed; 0: never"),
      Real("router.default_deadline_seconds", TANDEM_CONFIG_REF(router.default_deadline_seconds),
           0.001, 86400, "deadline of a request whose client set none"),
      List("router.prefill_workers", TANDEM_CONFIG_REF(router.prefill_workers),
           "static prefill worker addresses (workers may also register themselves)"),
      List("router.decode_workers", TANDEM_CONFIG_REF(router.decode_workers),
           "static decode worker addresses (workers may also register themselves)"),
      Real("router.heartbeat_interval_seconds",
           TANDEM_CONFIG_REF(router.heartbeat_interval_seconds), 0.01, 60,
           "worker heartbeat period; three missed heartbeats take a worker out of rotation"),
      Real("router.worker_keepalive_seconds", TANDEM_CONFIG_REF(router.worker_keepalive_seconds), 0,
           3600,
           "HTTP/2 ping period to workers while calls are in flight; a worker silent for as long "
           "again (hung, stopped, host gone) is disconnected and its requests are retried or "
           "migrated; 0 turns pings off"),
      Real("router.forget_workers_after_seconds",
           TANDEM_CONFIG_REF(router.forget_workers_after_seconds), 0, 7 * 24 * 3600,
           "a worker out of rotation this long (removed, or expired after three missed "
           "heartbeats) with no call in flight is forgotten: its channel and state are freed, so "
           "pods restarting under new addresses do not grow the router"),
      Real("router.drain_seconds", TANDEM_CONFIG_REF(router.drain_seconds), 0, 3600,
           "on SIGTERM: how long requests in flight may take to finish (new ones get "
           "UNAVAILABLE and health reports NOT_SERVING) before the server stops"),
      Str("router.http_listen", TANDEM_CONFIG_REF(router.http_listen), {},
          "host:port of the OpenAI-compatible HTTP API (/v1/completions, /v1/models, /health, "
          "/tokenize, /detokenize); empty: off"),
      Int("router.http_threads", TANDEM_CONFIG_REF(router.http_threads), 1, 64,
          "I/O threads of the HTTP front door (event-driven: connections do not hold threads)"),
      Int("router.http_max_body_bytes", TANDEM_CONFIG_REF(router.http_max_body_bytes), 1024,
          int64_t{1} << 30, "largest HTTP request body; larger ones get 413"),
      Real("router.http_read_timeout_seconds", TANDEM_CONFIG_REF(router.http_read_timeout_seconds),
           0.1, 3600,
           "time a client has to send a whole HTTP request (and an idle kept-alive connection "
           "stays open)"),
      Real("router.http_write_timeout_seconds",
           TANDEM_CONFIG_REF(router.http_write_timeout_seconds), 0.1, 3600,
           "time one HTTP write may take: a client that stops reading its stream is disconnected "
           "and its request aborted"),
      Int("router.max_n", TANDEM_CONFIG_REF(router.max_n), 1, 128,
          "most choices per prompt an HTTP request may ask for (n)"),
      Int("router.max_prompt_tokens", TANDEM_CONFIG_REF(router.max_prompt_tokens), 0, kMaxInt,
          "longest prompt in tokens (INVALID_ARGUMENT / HTTP 400 naming prompt beyond); 0: the "
          "model's context length"),
      Int("router.max_tokens", TANDEM_CONFIG_REF(router.max_tokens), 0, kMaxInt,
          "largest max_tokens a request may ask for; 0: the model's context length"),
      Int("router.max_stop_strings", TANDEM_CONFIG_REF(router.max_stop_strings), 0, 1024,
          "stop strings per request"),
      Int("router.max_stop_bytes", TANDEM_CONFIG_REF(router.max_stop_bytes), 1, 65536,
          "bytes per stop string"),
      Int("router.max_logprobs", TANDEM_CONFIG_REF(router.max_logprobs), 0, 1024,
          "most top alternatives per token a request may ask for (logprobs, top_logprobs)"),
      Bytes("router.max_request_bytes", TANDEM_CONFIG_REF(router.max_request_bytes), 1024,
            "largest gRPC request message the router accepts (RESOURCE_EXHAUSTED beyond)"),
      Int("router.http_max_header_bytes", TANDEM_CONFIG_REF(router.http_max_header_bytes), 1024,
          1 << 20, "largest HTTP request head, request line and headers (431 beyond)"),
      List("router.http_cors_origins", TANDEM_CONFIG_REF(router.http_cors_origins),
           "origins (scheme://host[:port], or \"*\" for any) whose pages may call the HTTP API "
           "from a browser (CORS); empty: none"),
      Real("balancer.hit_rate_threshold", TANDEM_CONFIG_REF(balancer.hit_rate_threshold), 0, 1,
           "decode KV hit rate below which the balancer engages (the 90% rule)"),
      Real("balancer.hysteresis", TANDEM_CONFIG_REF(balancer.hysteresis), 0, 1,
           "the balancer disengages at threshold + hysteresis for one window"),
      Real("balancer.window_seconds", TANDEM_CONFIG_REF(balancer.window_seconds), 0.1, 3600,
           "sliding window of the hit rate"),
      Int("balancer.min_lookups", TANDEM_CONFIG_REF(balancer.min_lookups), 1, kMaxInt,
          "block lookups a window needs before its hit rate counts"),
      Bytes("balancer.max_prefill_ahead_bytes", TANDEM_CONFIG_REF(balancer.max_prefill_ahead_bytes),
            0, "while engaged: KV bytes prefill may run ahead of decode admission"),
      Str("planner.profile", TANDEM_CONFIG_REF(planner.profile), {},
          "engine profile (engine-bench --profile-out) the router plans with; empty: no "
          "recommended replicas"),
      Real("planner.slo_ttft_ms", TANDEM_CONFIG_REF(planner.slo_ttft_ms), 0, 1e7,
           "time-to-first-token SLO the planner sizes for (0: none)"),
      Real("planner.slo_tpot_ms", TANDEM_CONFIG_REF(planner.slo_tpot_ms), 0, 1e7,
           "time-per-output-token SLO the planner sizes for (0: none)"),
      Real("planner.attainment", TANDEM_CONFIG_REF(planner.attainment), 0.01, 1,
           "fraction of requests that must meet both SLOs"),
      Real("planner.window_seconds", TANDEM_CONFIG_REF(planner.window_seconds), 1, 86400,
           "sliding window of the measured workload (arrival rate, prompt and output lengths)"),
      Real("planner.interval_seconds", TANDEM_CONFIG_REF(planner.interval_seconds), 1, 86400,
           "how often the router re-plans"),
      Int("planner.max_replicas", TANDEM_CONFIG_REF(planner.max_replicas), 1, 100000,
          "largest deployment (all roles) the planner recommends"),
      Real("planner.headroom", TANDEM_CONFIG_REF(planner.headroom), 1, 100,
           "size for the measured rate times this"),
      Int("planner.min_requests", TANDEM_CONFIG_REF(planner.min_requests), 1, kMaxInt,
          "finished requests the window needs before the planner recommends"),
      Bool("planner.shared_stack_cpu", TANDEM_CONFIG_REF(planner.shared_stack_cpu),
           "the router, store shards and clients run on the replicas' cores (one machine): "
           "charge the profile's shared_overhead costs to them; false where they have "
           "machines or pods of their own"),
      Bool("planner.correction", TANDEM_CONFIG_REF(planner.correction),
           "fit how much slower or faster than the profile each phase runs here, from the "
           "measured TTFT and TPOT of the live deployment, and plan on the corrected profile"),
      Real("planner.correction_smoothing", TANDEM_CONFIG_REF(planner.correction_smoothing), 0.01, 1,
           "weight of the newest round's fit in the correction factors (1: no smoothing)"),
      Str("prefill.listen", TANDEM_CONFIG_REF(prefill.listen), {}, listen_doc),
      Str("prefill.router", TANDEM_CONFIG_REF(prefill.router), {},
          "router address to register with; empty: static configuration only"),
      Str("prefill.advertise", TANDEM_CONFIG_REF(prefill.advertise), {}, advertise_doc),
      Str("decode.listen", TANDEM_CONFIG_REF(decode.listen), {}, listen_doc),
      Str("decode.router", TANDEM_CONFIG_REF(decode.router), {},
          "router address to register with; empty: static configuration only"),
      Str("decode.advertise", TANDEM_CONFIG_REF(decode.advertise), {}, advertise_doc),
      Str("cache_store.listen", TANDEM_CONFIG_REF(cache_store.listen), {}, listen_doc),
      List("cache_store.shards", TANDEM_CONFIG_REF(cache_store.shards),
           "addresses of every store shard; block keys are placed by consistent hashing"),
      Bytes("cache_store.capacity_bytes", TANDEM_CONFIG_REF(cache_store.capacity_bytes), 1 << 20,
            "block memory per shard (LRU beyond it)"),
      Bool("cache_store.shared_memory", TANDEM_CONFIG_REF(cache_store.shared_memory),
           "hand blocks to co-located processes through shared memory (a shard that serves "
           "the KV fabric keeps its blocks in its arena either way)"),
      Bool("cache_store.preallocate", TANDEM_CONFIG_REF(cache_store.preallocate),
           "the shard allocates its whole shared-memory arena at startup (and fails to start "
           "without the memory), and co-located workers map all of it in the background when "
           "they attach: no block write then faults a page in, which on a fresh arena is most of "
           "a put's time (docs/benchmarks.md); costs startup time and page tables (2 MiB per GiB "
           "in each process with 4 KiB pages)"),
      Str("cache_store.transport", TANDEM_CONFIG_REF(cache_store.transport),
          {"auto", "grpc", "shm", "ucx"},
          "how block bytes move between workers and shards (gRPC carries the control either "
          "way): shm through a co-located shard's shared memory, ucx over the UCX fabric "
          "(RDMA where the NIC has it, else TCP or shared memory, as UCX_TLS allows), grpc in "
          "the gRPC stream; auto takes shm for shards on this machine, ucx where both ends have "
          "it, grpc otherwise. A shard serves the fabric unless this is grpc or shm. With "
          "security.tls, ucx needs security.allow_unencrypted_kv_fabric"),
      Bool("cache_store.reserve_ahead", TANDEM_CONFIG_REF(cache_store.reserve_ahead),
           "prefill workers reserve a prompt's shared-memory space in the store while they "
           "compute it, so the upload after prefill is one round trip per shard (a prefix "
           "another request is writing is left to it, and put at upload if still unwritten)"),
      Bool("cache_store.load_prefixes", TANDEM_CONFIG_REF(cache_store.load_prefixes),
           "prefill workers look each prompt's blocks up in the store (memory and disk tiers) "
           "before computing it and compute only what no worker stored: prefixes computed by "
           "another prefill worker, or evicted from this one's cache (a multi-turn chat's "
           "earlier turns); costs a store lookup per prompt"),
      Bytes("cache_store.chunk_bytes", TANDEM_CONFIG_REF(cache_store.chunk_bytes), 4096,
            "size of a streamed Put/Get chunk"),
      Int("cache_store.lease_seconds", TANDEM_CONFIG_REF(cache_store.lease_seconds), 2, 3600,
          "how long a shard's lease on blocks lives without its commit or release: the longest "
          "a worker that stopped mid-transfer holds reserved or pinned memory (and its UCX "
          "transfer), and twice the age at which a worker stops trusting a shared-memory read "
          "or a reservation made ahead; shorter frees a stalled worker's memory sooner, but "
          "drops reservations of prompts that queued longer than half of it"),
      Str("cache_store.disk.directory", TANDEM_CONFIG_REF(cache_store.disk.directory), {},
          "a local directory for the shard's disk tier: blocks are written there as they are "
          "stored and read back when memory no longer holds them, and survive a restart; empty: "
          "memory only. tandem serve gives each of its shards a subdirectory shard-<i>"),
      Bytes("cache_store.disk.capacity_bytes", TANDEM_CONFIG_REF(cache_store.disk.capacity_bytes),
            4096, "disk tier size per shard, preallocated in whole segments (LRU beyond it)"),
      Bytes("cache_store.disk.segment_bytes", TANDEM_CONFIG_REF(cache_store.disk.segment_bytes),
            4096,
            "size of each preallocated segment file; changing it (or the capacity) discards "
            "what the directory holds"),
      Int("cache_store.disk.io_threads", TANDEM_CONFIG_REF(cache_store.disk.io_threads), 1, 64,
          "threads reading one request's blocks back from disk in parallel"),
      Str("metrics.listen", TANDEM_CONFIG_REF(metrics.listen), {},
          "host:port of the Prometheus /metrics endpoint; empty: none"),
      Bool("kv_cache_optimization.enabled", TANDEM_CONFIG_REF(kv_cache_optimization.enabled),
           "prefill-only layer pruning (POP) on prefill workers; decode never prunes"),
      Int("kv_cache_optimization.pruning.start_layer",
          TANDEM_CONFIG_REF(kv_cache_optimization.pruning_start_layer), 0, 4096,
          "0-based index of the first pruned layer (model.layers.N in the weights); must be a "
          "layer of the model"),
      Real("kv_cache_optimization.pruning.ratio",
           TANDEM_CONFIG_REF(kv_cache_optimization.pruning_ratio), 0.0, 1.0,
           "instead of start_layer: prune the last `ratio` of the layers, rounded to the nearest "
           "layer (POP prunes the last third: 0.33); 0: use start_layer"),
      Int("kv_cache_optimization.pruning.keep_every",
          TANDEM_CONFIG_REF(kv_cache_optimization.pruning_keep_every), 0, 4096,
          "the k-th, 2k-th, ... layers of the pruned range run at full depth; 0: none"),
      Int("kv_cache_optimization.protection.high_frequency_tokens",
          TANDEM_CONFIG_REF(kv_cache_optimization.protection_high_frequency_tokens), 0, kMaxInt,
          "positions of the N most frequent prompt ids (BOS/EOS not counted) keep full depth"),
      Int("kv_cache_optimization.min_batch_size",
          TANDEM_CONFIG_REF(kv_cache_optimization.min_batch_size), 1, 65536,
          "batches with fewer sequences are not pruned"),
      Real("kv_cache_optimization.monitor.sample_rate",
           TANDEM_CONFIG_REF(kv_cache_optimization.monitor_sample_rate), 0.0, 1.0,
           "attention-stability monitor: the fraction of prefill requests whose prompt (up to "
           "8192 tokens) is prefilled again, pruned and full, after its response, to export "
           "tandem_pruning_attention_cosine; each check holds the worker's engine for two "
           "prefills of the prompt; 0: off"),
      Real("kv_cache_optimization.monitor.alert_below",
           TANDEM_CONFIG_REF(kv_cache_optimization.monitor_alert_below), 0.0, 1.0,
           "a checked prompt with a pruned layer's attention-output cosine below this is logged "
           "and counted as an alert"),
      Str("serve.mode", TANDEM_CONFIG_REF(serve.mode), {"auto", "disaggregated", "colocated"},
          "`tandem serve`: disaggregated runs prefill and decode workers handing KV over through "
          "the store; colocated runs decode workers only, each serving whole requests; auto: "
          "disaggregated when prefill and decode compute on different devices or prefill "
          "prunes (kv_cache_optimization), else colocated (the startup line says which and "
          "why)"),
      Int("serve.prefill_chunk_tokens", TANDEM_CONFIG_REF(serve.prefill_chunk_tokens), 1, kMaxInt,
          "`tandem serve`, disaggregated on one device: tokens per prefill step; a decode step "
          "waits for at most one such step (smaller: lower time per output token, slower "
          "prefill)"),
      Int("serve.prefill_workers", TANDEM_CONFIG_REF(serve.prefill_workers), 1, 64,
          "`tandem serve`: prefill workers to start"),
      Int("serve.decode_workers", TANDEM_CONFIG_REF(serve.decode_workers), 1, 64,
          "`tandem serve`: decode workers to start"),
      Int("serve.cache_store_shards", TANDEM_CONFIG_REF(serve.cache_store_shards), 1, 64,
          "`tandem serve`: cache-store shards to start"),
      Str("serve.prefill_device", TANDEM_CONFIG_REF(serve.prefill_device), {},
          "`tandem serve`: where its prefill workers compute (cpu, cuda, cuda:N); empty: "
          "model.device"),
      Str("serve.decode_device", TANDEM_CONFIG_REF(serve.decode_device), {},
          "`tandem serve`: where its decode workers compute (cpu, cuda, cuda:N); empty: "
          "model.device"),
      Str("security.tls.ca_file", TANDEM_CONFIG_REF(security.tls.ca_file), {},
          "PEM file of the cluster CA; with cert_file and key_file, every internal connection "
          "is mutual TLS and every role is known by its certificate; empty: plaintext"),
      Str("security.tls.cert_file", TANDEM_CONFIG_REF(security.tls.cert_file), {},
          "PEM file of this process's certificate (intermediates may follow it); a URI SAN "
          "<role_uri_prefix><role> names its role: router, prefill, decode or cache_store"),
      Str("security.tls.key_file", TANDEM_CONFIG_REF(security.tls.key_file), {},
          "PEM file of the certificate's private key"),
      Int("security.tls.reload_seconds", TANDEM_CONFIG_REF(security.tls.reload_seconds), 1, 86400,
          "how often the three files are checked for changes; new connections use what they "
          "hold now (rotation without a restart)"),
      Str("security.role_uri_prefix", TANDEM_CONFIG_REF(security.role_uri_prefix), {},
          "a certificate's role is the URI SAN starting with this prefix, less the prefix"),
      Str("security.api_keys_file", TANDEM_CONFIG_REF(security.api_keys_file), {},
          "the public API's keys (gRPC and HTTP; clients send `authorization: Bearer KEY`): one "
          "per line, `<sha256 of the key, hex> <name> [max_concurrent=N] "
          "[tokens_per_minute=N]`, read again when it changes; `tandem api-key NAME` makes a "
          "key and its line; empty: no key needed"),
      Int("security.api_key_max_concurrent", TANDEM_CONFIG_REF(security.api_key_max_concurrent), 0,
          int64_t{1} << 40,
          "requests one API key may have in flight (RESOURCE_EXHAUSTED / HTTP 429 beyond); a "
          "key's own max_concurrent= overrides it; 0: no limit"),
      Int("security.api_key_tokens_per_minute",
          TANDEM_CONFIG_REF(security.api_key_tokens_per_minute), 0, int64_t{1} << 40,
          "prompt + generated tokens one API key may use over any 60 s (RESOURCE_EXHAUSTED / "
          "HTTP 429 with a retry hint beyond); a key's own tokens_per_minute= overrides it; 0: "
          "no limit"),
      Bool("security.health_needs_key", TANDEM_CONFIG_REF(security.health_needs_key),
           "with security.api_keys_file: the HTTP door's GET /health asks for a key too (by "
           "default it stays open for load balancers; grpc.health.v1 and /metrics always do)"),
      Bool("security.cache_salt_per_key", TANDEM_CONFIG_REF(security.cache_salt_per_key),
           "salt every request's KV-cache blocks with its API key's name: tenants never reuse "
           "(so cannot time) each other's cached prompts, at the cost of shared prefixes such as "
           "a common system prompt; a request's own cache_salt field works either way"),
      Bool("security.allow_unencrypted_kv_fabric",
           TANDEM_CONFIG_REF(security.allow_unencrypted_kv_fabric),
           "with security.tls: still move KV blocks over the UCX fabric (cache_store.transport), "
           "which neither encrypts nor authenticates its bytes (docs/security.md); for a "
           "dedicated RDMA network only. Without it, such deployments keep KV bytes on TLS"),
      Bool("security.allow_insecure", TANDEM_CONFIG_REF(security.allow_insecure),
           "let a role listen beyond loopback without TLS (a trusted lab network only: any "
           "process that reaches its ports is trusted); without it such a role refuses to "
           "start"),
  };
}

#undef TANDEM_CONFIG_REF

}  // namespace

const std::vector<Field>& Schema() {
  static const std::vector<Field>* schema = new std::vector<Field>(MakeSchema());
  return *schema;
}

const Field* FindField(std::string_view key) {
  for (const Field& f : Schema()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

}  // namespace tandem::config::internal
