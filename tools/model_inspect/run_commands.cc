#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/engine/engine.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/model/pruning_check.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "common/util/thread_pool.h"
#include "tools/model_inspect/commands.h"

namespace tandem::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ThreadPool>> MakePool(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(int64_t threads, args.IntOr("threads", 0));
  if (threads < 0 || threads > 1024) return absl::InvalidArgumentError("--threads out of range");
  if (threads == 0) {
    if (const char* env = std::getenv("TANDEM_NUM_THREADS")) threads = std::atoi(env);
  }
  return std::make_unique<ThreadPool>(static_cast<int>(threads));
}

// "auto" means the model's own dtype, as Hugging Face stores KV in the activation dtype.
absl::StatusOr<DType> KvDType(const CliArgs& args, const model::ModelConfig& c) {
  std::string name = args.StringOr("kv-dtype", "auto");
  if (name == "auto") return c.torch_dtype;
  if (name == "mixed") return DType::kF16;
  return ParseKvDType(name);
}

absl::StatusOr<engine::EngineOptions::MixedKv> MixedKvFromFlags(const CliArgs& args) {
  engine::EngineOptions::MixedKv m;
  m.enabled = args.StringOr("kv-dtype", "auto") == "mixed";
  if (!m.enabled && (args.Has("kv-sink-tokens") || args.Has("kv-window-tokens"))) {
    return absl::InvalidArgumentError(
        "--kv-sink-tokens and --kv-window-tokens need --kv-dtype mixed");
  }
  TANDEM_ASSIGN_OR_RETURN(int64_t sink, args.IntOr("kv-sink-tokens", m.sink_tokens));
  TANDEM_ASSIGN_OR_RETURN(int64_t window, args.IntOr("kv-window-tokens", m.window_tokens));
  constexpr int64_t kMax = int64_t{1} << 30;
  if (sink < 0 || sink > kMax || window < 0 || window > kMax) {
    return absl::InvalidArgumentError("--kv-sink-tokens and --kv-window-tokens must be >= 0");
  }
  m.sink_tokens = static_cast<int>(sink);
  m.window_tokens = static_cast<int>(window);
  return m;
}

absl::StatusOr<std::unique_ptr<model::Model>> LoadModel(const CliArgs& args, ThreadPool& pool) {
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  model::WeightLoadOptions options;
  TANDEM_ASSIGN_OR_RETURN(options.memory,
                          model::ParseWeightMemory(args.StringOr("weight-memory", "mmap")));
  TANDEM_RETURN_IF_ERROR(model::QuantizationFromFlags(args, options));
  TANDEM_ASSIGN_OR_RETURN(options.cpu_gemm,
                          kernels::ParseCpuGemm(args.StringOr("cpu-gemm", "auto")));
  return model::Model::Load(dir, pool, options);
}

absl::StatusOr<kv::EvictionPolicy> EvictionFromFlags(const CliArgs& args) {
  kv::EvictionPolicy p;
  TANDEM_ASSIGN_OR_RETURN(int64_t budget, args.IntOr("evict-budget-tokens", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t sinks, args.IntOr("evict-sink-tokens", p.sink_tokens));
  TANDEM_ASSIGN_OR_RETURN(p.shift_threshold,
                          args.DoubleOr("evict-shift-threshold", p.shift_threshold));
  const std::string policy = args.StringOr("evict-policy", "sliding");
  constexpr int64_t kMax = int64_t{1} << 30;
  if (budget < 0 || budget > kMax || sinks < 0 || sinks > kMax ||
      (policy != "sliding" && policy != "semantic") ||
      !(p.shift_threshold >= 0 && p.shift_threshold <= 10)) {
    return absl::InvalidArgumentError(
        "--evict-budget-tokens and --evict-sink-tokens must be >= 0, --evict-policy sliding or "
        "semantic, --evict-shift-threshold in [0, 10]");
  }
  p.budget_tokens = static_cast<int>(budget);
  p.sink_tokens = static_cast<int>(sinks);
  p.semantic = policy == "semantic";
  return p;
}

absl::StatusOr<TextEvalInputs> LoadTextEval(const CliArgs& args, const std::string& text_path) {
  TextEvalInputs in;
  TANDEM_ASSIGN_OR_RETURN(in.text, ReadFileToString(text_path));
  TANDEM_ASSIGN_OR_RETURN(in.dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(in.tokenizer, tokenizer::Tokenizer::Load(in.dir));
  TANDEM_ASSIGN_OR_RETURN(in.pool, MakePool(args));
  TANDEM_ASSIGN_OR_RETURN(in.model, LoadModel(args, *in.pool));
  return in;
}

absl::StatusOr<bool> PruningFromFlags(const CliArgs& args, int num_layers,
                                      model::PruningSettings* settings) {
  if (!args.Has("prune-start-layer") && !args.Has("prune-ratio")) {
    if (args.Has("prune-keep-every") || args.Has("protect-tokens")) {
      return absl::InvalidArgumentError(
          "--prune-keep-every and --protect-tokens need --prune-start-layer or --prune-ratio");
    }
    return false;
  }
  if (args.Has("prune-start-layer") && args.Has("prune-ratio")) {
    return absl::InvalidArgumentError("give --prune-start-layer or --prune-ratio, not both");
  }
  TANDEM_ASSIGN_OR_RETURN(double ratio, args.DoubleOr("prune-ratio", 0.0));
  TANDEM_ASSIGN_OR_RETURN(int64_t start, args.IntOr("prune-start-layer", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t keep_every, args.IntOr("prune-keep-every", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t protect, args.IntOr("protect-tokens", 0));
  constexpr int64_t kMax = int64_t{1} << 30;
  if (args.Has("prune-ratio") && !(ratio > 0 && ratio <= 1)) {
    return absl::InvalidArgumentError("--prune-ratio must be in (0, 1]");
  }
  if (start < 0 || start > kMax || keep_every < 0 || keep_every > kMax || protect < 0 ||
      protect > kMax) {
    return absl::InvalidArgumentError(
        "--prune-start-layer, --prune-keep-every and --protect-tokens must be >= 0");
  }
  TANDEM_ASSIGN_OR_RETURN(
      *settings,
      model::ResolvePruningSettings(static_cast<int>(start), ratio, static_cast<int>(keep_every),
                                    static_cast<int>(protect), num_layers));
  return true;
}

absl::Status RunForward(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags(
      {"model", "tokens", "logits-out", "kv-dtype", "threads", "weight-memory", "cpu-gemm",
       "prune-start-layer", "prune-ratio", "prune-keep-every", "protect-tokens"})));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, args.IntList("tokens"));
  TANDEM_ASSIGN_OR_RETURN(std::string out_path, args.String("logits-out"));
  if (tokens.empty()) return absl::InvalidArgumentError("--tokens is empty");
  TANDEM_ASSIGN_OR_RETURN(auto pool, MakePool(args));
  TANDEM_ASSIGN_OR_RETURN(auto model, LoadModel(args, *pool));
  const auto& c = model->config();
  TANDEM_ASSIGN_OR_RETURN(DType kv_dtype, KvDType(args, c));
  if (args.StringOr("kv-dtype", "auto") == "mixed") {
    return absl::InvalidArgumentError(
        "--kv-dtype mixed needs generate: one forward pass keeps every token in fp16");
  }
  kv::KvCacheOptions kv_options;
  kv_options.layout = c.KvLayoutFor(kv_dtype, 16);
  kv_options.num_blocks = (static_cast<int64_t>(tokens.size()) + 15) / 16;
  kv_options.model_id = dir;
  kv_options.enable_prefix_caching = false;
  TANDEM_ASSIGN_OR_RETURN(auto kv, kv::KvCacheManager::Create(kv_options));
  TANDEM_RETURN_IF_ERROR(kv->AddSequence(1, tokens).status());
  TANDEM_RETURN_IF_ERROR(kv->Reserve(1, static_cast<int>(tokens.size())));
  model::ForwardSequence seq{.tokens = tokens.data(),
                             .num_tokens = static_cast<int>(tokens.size()),
                             .start_pos = 0,
                             .block_table = kv->BlockTableData(1),
                             .logits = model::LogitsMode::kAll};
  // Pruned prefill: the last token and the protected positions run every layer.
  model::PruningSettings settings;
  TANDEM_ASSIGN_OR_RETURN(bool prune, PruningFromFlags(args, c.num_layers, &settings));
  const std::vector<uint8_t> pruned_layers = model::PrunedLayers(settings, c.num_layers);
  const std::vector<uint8_t> full_depth = model::PromptFullDepth(tokens, settings, c);
  const model::PruningPlan plan{pruned_layers, full_depth};
  std::vector<float> logits;
  auto t0 = Clock::now();
  TANDEM_RETURN_IF_ERROR(
      model->Forward({&seq, 1}, kv->pool_base(), kv->layout(), logits, prune ? &plan : nullptr));
  auto t1 = Clock::now();
  TANDEM_RETURN_IF_ERROR(
      WriteStringToFile(out_path, std::string_view(reinterpret_cast<const char*>(logits.data()),
                                                   logits.size() * sizeof(float))));
  std::fprintf(stderr, "forward: %zu tokens in %.3f s; logits [%zu, %lld] -> %s\n", tokens.size(),
               Seconds(t0, t1), tokens.size(), static_cast<long long>(c.vocab_size),
               out_path.c_str());
  return absl::OkStatus();
}

absl::Status RunGenerate(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags({"model",
                                                                       "tokens",
                                                                       "prompt",
                                                                       "max-tokens",
                                                                       "temperature",
                                                                       "top-p",
                                                                       "top-k",
                                                                       "seed",
                                                                       "presence-penalty",
                                                                       "frequency-penalty",
                                                                       "repetition-penalty",
                                                                       "logprobs",
                                                                       "prompt-logprobs",
                                                                       "ignore-eos",
                                                                       "kv-dtype",
                                                                       "kv-sink-tokens",
                                                                       "kv-window-tokens",
                                                                       "evict-budget-tokens",
                                                                       "evict-sink-tokens",
                                                                       "evict-policy",
                                                                       "evict-shift-threshold",
                                                                       "threads",
                                                                       "weight-memory",
                                                                       "cpu-gemm",
                                                                       "prune-start-layer",
                                                                       "prune-ratio",
                                                                       "prune-keep-every",
                                                                       "protect-tokens"})));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(PromptTokens prompt, ResolvePrompt(args));
  const std::vector<int32_t>& tokens = prompt.ids;
  engine::Request request;
  request.id = "generate";
  request.prompt = tokens;
  request.ignore_eos = args.Has("ignore-eos");
  TANDEM_ASSIGN_OR_RETURN(int64_t max_tokens, args.IntOr("max-tokens", 16));
  TANDEM_ASSIGN_OR_RETURN(double temperature, args.DoubleOr("temperature", 0.0));
  TANDEM_ASSIGN_OR_RETURN(double top_p, args.DoubleOr("top-p", 1.0));
  TANDEM_ASSIGN_OR_RETURN(int64_t top_k, args.IntOr("top-k", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t seed, args.IntOr("seed", 0));
  request.max_tokens = static_cast<int>(std::clamp<int64_t>(max_tokens, -1, 1 << 30));
  TANDEM_ASSIGN_OR_RETURN(double presence, args.DoubleOr("presence-penalty", 0.0));
  TANDEM_ASSIGN_OR_RETURN(double frequency, args.DoubleOr("frequency-penalty", 0.0));
  TANDEM_ASSIGN_OR_RETURN(double repetition, args.DoubleOr("repetition-penalty", 1.0));
  TANDEM_ASSIGN_OR_RETURN(int64_t top_logprobs, args.IntOr("logprobs", -1));
  TANDEM_ASSIGN_OR_RETURN(int64_t prompt_logprobs, args.IntOr("prompt-logprobs", -1));
  request.prompt_logprobs = static_cast<int>(std::clamp<int64_t>(prompt_logprobs, -2, 1 << 20));
  request.sampling = {.temperature = static_cast<float>(temperature),
                      .top_p = static_cast<float>(top_p),
                      .top_k = static_cast<int>(std::clamp<int64_t>(top_k, -1, 1 << 30)),
                      .seed = static_cast<uint64_t>(seed),
                      .presence_penalty = static_cast<float>(presence),
                      .frequency_penalty = static_cast<float>(frequency),
                      .repetition_penalty = static_cast<float>(repetition),
                      .logprobs = static_cast<int>(std::clamp<int64_t>(top_logprobs, -2, 1 << 20))};
  TANDEM_ASSIGN_OR_RETURN(auto pool, MakePool(args));
  TANDEM_ASSIGN_OR_RETURN(auto model, LoadModel(args, *pool));
  engine::EngineOptions options;
  TANDEM_ASSIGN_OR_RETURN(options.kv_dtype, KvDType(args, model->config()));
  options.model_id = dir;
  TANDEM_ASSIGN_OR_RETURN(options.mixed_kv, MixedKvFromFlags(args));
  TANDEM_ASSIGN_OR_RETURN(options.kv_eviction, EvictionFromFlags(args));
  int64_t needed = static_cast<int64_t>(tokens.size()) + std::max<int64_t>(max_tokens, 0);
  options.num_blocks = std::max<int64_t>(1, (needed + options.block_size - 1) / options.block_size);
  if (options.mixed_kv.enabled) {  // memory is no object here: fp16 blocks for the whole run
    options.mixed_kv.wide_blocks = options.num_blocks;
    options.num_blocks *= 2;
  }
  // A pruned prefill (POP) of the one prompt; decode runs the full model.
  TANDEM_ASSIGN_OR_RETURN(
      options.pruning.enabled,
      PruningFromFlags(args, model->config().num_layers, &options.pruning.settings));
  options.pruning.min_batch_size = 1;
  TANDEM_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(*model, options));
  TANDEM_RETURN_IF_ERROR(engine->AddRequest(std::move(request)));
  std::vector<int32_t> generated;
  std::vector<model::TokenLogprobs> logprobs, prompt_lps;
  engine::FinishReason finish = engine::FinishReason::kNone;
  auto t0 = Clock::now();
  Clock::time_point first_token;
  while (engine->HasUnfinished()) {
    TANDEM_ASSIGN_OR_RETURN(auto outputs, engine->Step());
    for (const auto& out : outputs) {
      if (generated.empty() && !out.new_tokens.empty()) first_token = Clock::now();
      generated.insert(generated.end(), out.new_tokens.begin(), out.new_tokens.end());
      logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
      prompt_lps.insert(prompt_lps.end(), out.prompt_logprobs.begin(), out.prompt_logprobs.end());
      if (out.finish == engine::FinishReason::kError) return out.error;
      if (out.finish != engine::FinishReason::kNone) finish = out.finish;
    }
  }
  auto t1 = Clock::now();
  TANDEM_RETURN_IF_ERROR(PrintGenerated(generated, prompt));
  // One line per token: "logprob ID LOGPROB TOP_ID:LOGPROB ...", the prompt's first.
  auto print = [](const char* what, int32_t id, const model::TokenLogprobs& lps) {
    std::string line = absl::StrFormat("%s %d %.9g", what, id, lps.logprob);
    for (const auto& [top, lp] : lps.top) absl::StrAppendFormat(&line, " %d:%.9g", top, lp);
    std::printf("%s\n", line.c_str());
  };
  for (size_t i = 0; i < prompt_lps.size() && i + 1 < tokens.size(); ++i) {
    print("prompt_logprob", tokens[i + 1], prompt_lps[i]);
  }
  for (size_t i = 0; i < logprobs.size() && i < generated.size(); ++i) {
    print("logprob", generated[i], logprobs[i]);
  }
  double decode_s = generated.size() > 1 ? Seconds(first_token, t1) : 0;
  std::fprintf(stderr,
               "generate: prompt %zu tokens, %zu generated (finish: %s); prefill %.3f s "
               "(%.1f tok/s), decode %.1f tok/s\n",
               tokens.size(), generated.size(),
               std::string(engine::FinishReasonName(finish)).c_str(), Seconds(t0, first_token),
               tokens.size() / std::max(1e-9, Seconds(t0, first_token)),
               decode_s > 0 ? (generated.size() - 1) / decode_s : 0.0);
  return absl::OkStatus();
}

}  // namespace tandem::tools
