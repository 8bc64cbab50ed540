#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "common/util/status_macros.h"
#include "tools/model_inspect/commands.h"

namespace tandem::tools {
namespace {

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat("%.2f %s", bytes, units[u]);
}

}  // namespace

absl::Status RunInfo(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(
      args.CheckKnown(model::WithQuantizationFlags({"model", "threads", "cpu-gemm"})));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(model::ModelConfig c, model::ModelConfig::FromDirectory(dir));
  model::WeightLoadOptions load;
  TANDEM_RETURN_IF_ERROR(model::QuantizationFromFlags(args, load));
  TANDEM_ASSIGN_OR_RETURN(load.cpu_gemm, kernels::ParseCpuGemm(args.StringOr("cpu-gemm", "auto")));
  ThreadPool pool;
  load.pool = &pool;
  // Loading the weights validates every tensor; info reports what the files really hold.
  TANDEM_ASSIGN_OR_RETURN(auto weights, model::ModelWeights::Load(dir, c, load));
  std::printf("model: %s\n", dir.c_str());
  std::printf("architecture: %s (%s)\n", c.architecture_name.c_str(),
              std::string(model::ArchitectureName(c.architecture)).c_str());
  std::printf("parameters: %lld (%.3f B)\n", static_cast<long long>(c.ParameterCount()),
              c.ParameterCount() / 1e9);
  std::printf("weights dtype: %s (%s in weight files)\n",
              std::string(DTypeName(weights->dtype)).c_str(),
              HumanBytes(static_cast<double>(weights->total_bytes)).c_str());
  std::printf("weight format: %s (%s in memory)\n", weights->format().c_str(),
              HumanBytes(static_cast<double>(weights->memory_bytes)).c_str());
  std::printf("cpu gemm: %s%s\n", weights->cpu_gemm.c_str(),
              weights->cpu_gemm_implementation.empty()
                  ? ""
                  : (", " + weights->cpu_gemm_implementation).c_str());
  std::printf("kernels: %s (workers registering with a router compare them)\n",
              weights->kernels.c_str());
  std::printf("context length: %lld\n", static_cast<long long>(c.ContextLength()));
  std::printf("layers: %d\nhidden size: %lld\nintermediate size: %lld\n", c.num_layers,
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.intermediate_size));
  std::printf("attention heads: %d\nkv heads: %d (%s)\nhead dim: %d\n", c.num_heads, c.num_kv_heads,
              c.num_kv_heads == c.num_heads ? "MHA" : (c.num_kv_heads == 1 ? "MQA" : "GQA"),
              c.head_dim);
  std::printf("vocab size: %lld\ntied embeddings: %s\n", static_cast<long long>(c.vocab_size),
              c.tie_word_embeddings ? "yes" : "no");
  std::printf("rope theta: %g\nrope scaling: %s\n", c.rope_theta,
              c.rope_scaling.type == model::RopeScaling::Type::kLlama3   ? "llama3"
              : c.rope_scaling.type == model::RopeScaling::Type::kLinear ? "linear"
                                                                         : "none");
  kv::KvLayout layout = c.KvLayoutFor(c.torch_dtype, 16);
  std::printf("kv bytes per token (%s): %zu\n", std::string(DTypeName(layout.dtype)).c_str(),
              layout.BytesPerToken());
  return absl::OkStatus();
}

namespace {

// --kv-cache --kv-dtype mixed: the average at the given context, against fp16.
absl::Status PrintMixedKvCache(const std::string& dir, const model::ModelConfig& c,
                               const kv::KvLayout& wide, const engine::EngineOptions::MixedKv& m,
                               int64_t context, int64_t memory) {
  kv::KvLayout narrow = wide;
  narrow.dtype = DType::kI8;
  const kv::MixedKvFootprint f = kv::MixedFootprint(
      wide, {.sink_tokens = m.sink_tokens, .window_tokens = m.window_tokens}, context);
  const double per_token = static_cast<double>(f.bytes) / static_cast<double>(context);
  std::printf("model: %s (%s, %d layers, %d kv heads, head dim %d)\n", dir.c_str(),
              c.architecture_name.c_str(), c.num_layers, c.num_kv_heads, c.head_dim);
  std::printf(
      "kv dtype: mixed (fp16 for the first %d sink tokens and the last %d, int8 with an fp16 "
      "scale per token and head for the rest, in whole blocks of %d)\n",
      m.sink_tokens, m.window_tokens, wide.block_size);
  std::printf("bytes per token: fp16 %zu, int8 %zu\n", wide.BytesPerToken(),
              narrow.BytesPerToken());
  std::printf("at %lld tokens: %lld fp16 + %lld int8\n", static_cast<long long>(context),
              static_cast<long long>(f.wide_tokens), static_cast<long long>(f.narrow_tokens));
  std::printf("bytes per token: %.1f (average at %lld tokens)\n", per_token,
              static_cast<long long>(context));
  std::printf("saving against fp16: %.1f%%\n",
              100.0 * (1.0 - per_token / static_cast<double>(wide.BytesPerToken())));
  std::printf("bytes for one sequence of %lld tokens: %llu (%s)\n", static_cast<long long>(context),
              static_cast<unsigned long long>(f.bytes),
              HumanBytes(static_cast<double>(f.bytes)).c_str());
  if (memory > 0) {
    std::printf("tokens that fit in %lld bytes (%s) at that average: %.0f\n",
                static_cast<long long>(memory), HumanBytes(static_cast<double>(memory)).c_str(),
                static_cast<double>(memory) / per_token);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunKvCache(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(
      args.CheckKnown({"model", "kv-cache", "context", "kv-dtype", "kv-sink-tokens",
                       "kv-window-tokens", "memory", "threads"}));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(model::ModelConfig c, model::ModelConfig::FromDirectory(dir));
  TANDEM_ASSIGN_OR_RETURN(DType dtype, KvDType(args, c));
  TANDEM_ASSIGN_OR_RETURN(engine::EngineOptions::MixedKv mixed, MixedKvFromFlags(args));
  TANDEM_ASSIGN_OR_RETURN(int64_t context, args.IntOr("context", c.ContextLength()));
  if (context <= 0) return absl::InvalidArgumentError("--context must be positive");
  TANDEM_ASSIGN_OR_RETURN(int64_t memory, args.BytesOr("memory", 0));
  kv::KvLayout layout = c.KvLayoutFor(dtype, 16);
  if (mixed.enabled) return PrintMixedKvCache(dir, c, layout, mixed, context, memory);
  const uint64_t per_layer = layout.BytesPerToken() / c.num_layers;
  const uint64_t per_token = layout.BytesPerToken();
  std::printf("model: %s (%s, %d layers, %d kv heads, head dim %d)\n", dir.c_str(),
              c.architecture_name.c_str(), c.num_layers, c.num_kv_heads, c.head_dim);
  std::printf("kv dtype: %s (%zu byte%s per element)\n", std::string(DTypeName(dtype)).c_str(),
              layout.ElementBytes(), layout.ElementBytes() == 1 ? "" : "s");
  if (layout.ScaleBytes() > 0) {
    std::printf(
        "formula: 2 (K and V) x %d kv heads x (%d head dim x %zu byte + %zu-byte scale) = %llu "
        "per layer\n",
        c.num_kv_heads, c.head_dim, layout.ElementBytes(), layout.ScaleBytes(),
        static_cast<unsigned long long>(per_layer));
  } else {
    std::printf("formula: 2 (K and V) x %d kv heads x %d head dim x %zu bytes = %llu per layer\n",
                c.num_kv_heads, c.head_dim, layout.ElementBytes(),
                static_cast<unsigned long long>(per_layer));
  }
  std::printf("bytes per token per layer: %llu\n", static_cast<unsigned long long>(per_layer));
  std::printf("bytes per token: %llu\n", static_cast<unsigned long long>(per_token));
  double seq_bytes = static_cast<double>(per_token) * static_cast<double>(context);
  std::printf("bytes for one sequence of %lld tokens: %.0f (%s)\n", static_cast<long long>(context),
              seq_bytes, HumanBytes(seq_bytes).c_str());
  std::printf("note: KV memory grows linearly with sequence length (not quadratically)\n");
  if (memory > 0) {
    std::printf("tokens that fit in %lld bytes (%s): %llu\n", static_cast<long long>(memory),
                HumanBytes(static_cast<double>(memory)).c_str(),
                static_cast<unsigned long long>(memory / per_token));
  }
  return absl::OkStatus();
}

}  // namespace tandem::tools
