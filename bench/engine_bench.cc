// engine-bench: end-to-end prefill and decode throughput of the engine on a model directory,
// with the memory-bandwidth bound beside each decode figure. Prints a Markdown table.
//
//   engine-bench --model DIR [--prompt-lens 128,512,2048] [--batches 1,8,32]
//                [--decode-steps 32] [--repeats 3] [--threads N] [--weight-memory mmap|hugepages]
//                [--prune-ratios 0.25,0.333,0.5] [--device cpu|cuda|cuda:N]
//                [--weight-quantization none|int8|int4 [--weight-quantization-group-size G]]
//                [--activation-quantization none|int8|int8-token]
//                [--lm-head-quantization none|int8]
//                [--cpu-gemm auto|tandem|onednn]
//
// On a device other than the CPU the bound uses host memory bandwidth only when asked for
// (--skip-bandwidth is implied): the device's is not measured here.
//
// --prune-ratios adds prefill-only pruning (POP) rows: each prompt length prefilled by an engine
// step, as on a prefill worker, with the last R of the layers pruned (only the last token at full
// depth, as POP measures) against the same prompt unpruned, interleaved within each repeat;
// speed-up is the ratio of the medians.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/kernels/backend_factory.h"
#include "common/kv/kv_cache_manager.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/planner/profile.h"
#include "common/util/cli_args.h"
#include "common/util/file_util.h"
#include "common/util/huge_page_arena.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Plain read bandwidth, in the same kind of memory as the weights (2 MiB pages for hugepages,
// heap pages for mmap). The host is shared and its bandwidth drifts, so each decode repeat
// measures it right before it runs and is compared with that figure.
class BandwidthProbe {
 public:
  static absl::StatusOr<BandwidthProbe> Create(model::WeightMemory memory) {
    BandwidthProbe probe;
    if (memory == model::WeightMemory::kHugePages) {
      probe.arena_ = std::make_unique<HugePageArena>();
      TANDEM_ASSIGN_OR_RETURN(uint8_t * bytes, probe.arena_->Allocate(kFloats * sizeof(float)));
      probe.buf_ = reinterpret_cast<float*>(bytes);
    } else {
      probe.heap_.resize(kFloats);
      probe.buf_ = probe.heap_.data();
    }
    std::fill_n(probe.buf_, kFloats, 1.0f);
    return probe;
  }

  // Bytes/s: the best of `runs` reads of 1 GiB, all threads summing disjoint slices (a bound,
  // so the fastest run counts).
  double Measure(ThreadPool& pool, int runs = 3) const {
    double best = 0;
    for (int rep = 0; rep < runs; ++rep) {
      std::vector<double> partial(pool.num_threads() * 8, 0);
      auto t0 = Clock::now();
      pool.ParallelFor(kFloats, 1 << 20, [&](int64_t b, int64_t e) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        for (int64_t i = b; i + 32 <= e; i += 32) {
          for (int j = 0; j < 4; ++j) {
            acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(&buf_[i + 8 * j]));
          }
        }
        float tmp[8];
        _mm256_storeu_ps(
            tmp, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        partial[(b * pool.num_threads() / kFloats) * 8] += tmp[0];
      });
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      best = std::max(best, kFloats * sizeof(float) / seconds);
    }
    return best;
  }

 private:
  static constexpr int64_t kFloats = (int64_t{1} << 30) / sizeof(float);
  std::unique_ptr<HugePageArena> arena_;
  std::vector<float> heap_;
  float* buf_ = nullptr;
};

engine::Request MakeRequest(const std::string& id, int len, int max_tokens, int vocab) {
  std::mt19937 rng(len * 7919 + std::hash<std::string>{}(id));
  engine::Request r;
  r.id = id;
  r.prompt.resize(len);
  for (auto& t : r.prompt) t = static_cast<int32_t>(rng() % vocab);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

// Seconds to prefill one prompt of `len` tokens (first token sampled), prefix cache off.
absl::StatusOr<double> TimePrefill(model::Model& m, int len, int rep) {
  engine::EngineOptions o;
  o.chunk_size = len;
  o.max_num_batched_tokens = len;
  o.num_blocks = len / 16 + 4;
  o.enable_prefix_caching = false;
  TANDEM_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(m, o));
  TANDEM_RETURN_IF_ERROR(
      e->AddRequest(MakeRequest(absl::StrCat("p", rep), len, 1, m.config().vocab_size)));
  auto t0 = Clock::now();
  while (e->HasUnfinished()) TANDEM_RETURN_IF_ERROR(e->Step().status());
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Decode tokens/s with `batch` sequences of 64-token prompts, timed after all prefills.
absl::StatusOr<double> TimeDecode(model::Model& m, int batch, int steps) {
  engine::EngineOptions o;
  o.max_num_seqs = batch;
  o.num_blocks = batch * ((64 + steps + 2) / 16 + 2);
  o.enable_prefix_caching = false;
  TANDEM_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(m, o));
  for (int i = 0; i < batch; ++i) {
    TANDEM_RETURN_IF_ERROR(
        e->AddRequest(MakeRequest(absl::StrCat("d", i), 64, steps + 2, m.config().vocab_size)));
  }
  // Prefill everything (one step each until every sequence produced its first token).
  int produced = 0;
  while (produced < batch) {
    TANDEM_ASSIGN_OR_RETURN(auto outs, e->Step());
    for (const auto& out : outs) produced += out.completion_tokens == 1;
  }
  int64_t tokens = 0;
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    TANDEM_ASSIGN_OR_RETURN(auto outs, e->Step());
    for (const auto& out : outs) tokens += static_cast<int64_t>(out.new_tokens.size());
  }
  return tokens / std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds for the engine step that prefills one `len`-token prompt and samples its first token,
// as a prefill worker runs it, with the layers from `start_layer` on pruned (POP: every prompt
// token but the last skips them; num_layers: unpruned).
absl::StatusOr<double> TimePrunedPrefill(model::Model& m, int len, int start_layer) {
  engine::EngineOptions o;
  o.kv_dtype = m.config().torch_dtype;
  o.num_blocks = len / 16 + 2;
  o.max_num_batched_tokens = o.chunk_size = len;
  o.enable_prefix_caching = false;
  o.model_id = "engine-bench";
  o.pruning = {.enabled = start_layer < m.config().num_layers,
               .settings = {.start_layer = start_layer},
               .min_batch_size = 1};
  TANDEM_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(m, o));
  TANDEM_RETURN_IF_ERROR(e->AddRequest(MakeRequest("pop", len, 1, m.config().vocab_size)));
  auto t0 = Clock::now();
  TANDEM_ASSIGN_OR_RETURN(auto outs, e->Step());
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (outs.size() != 1 || outs[0].new_tokens.size() != 1) {
    return absl::InternalError("the prefill step did not produce the first token");
  }
  return seconds;
}

absl::Status RunPruning(model::Model& m, std::span<const int32_t> lens,
                        std::span<const double> ratios, int repeats) {
  const int layers = m.config().num_layers;
  std::printf("\n| prompt | pruned layers | unpruned tokens/s | pruned tokens/s | speed-up |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int len : lens) {
    for (double ratio : ratios) {
      const int start = model::StartLayerForRatio(ratio, layers);
      std::vector<double> full, pruned;
      for (int r = 0; r < repeats; ++r) {
        TANDEM_ASSIGN_OR_RETURN(double a, TimePrunedPrefill(m, len, layers));
        TANDEM_ASSIGN_OR_RETURN(double b, TimePrunedPrefill(m, len, start));
        full.push_back(len / a);
        pruned.push_back(len / b);
      }
      std::printf("| %d | %d of %d (%.2f) | %.1f | %.1f | %.2fx |\n", len, layers - start, layers,
                  ratio, Median(full), Median(pruned), Median(pruned) / Median(full));
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

// --profile-out: the step times the planner's simulator needs (common/planner/profile.h).

// Prefill: one prompt of `len` tokens in chunks of `chunk`, each step timed; a sample per
// chunk (its tokens, the context before it), the median over `repeats`.
absl::StatusOr<std::vector<planner::StepSample>> ProfilePrefill(model::Model& m, int len, int chunk,
                                                                int repeats) {
  std::vector<std::vector<double>> times;  // [chunk index][repeat]
  for (int r = 0; r < repeats; ++r) {
    engine::EngineOptions o;
    o.chunk_size = o.max_num_batched_tokens = chunk;
    o.num_blocks = len / 16 + 4;
    o.enable_prefix_caching = false;
    TANDEM_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(m, o));
    TANDEM_RETURN_IF_ERROR(e->AddRequest(
        MakeRequest(absl::StrCat("profile", chunk, "_", r), len, 1, m.config().vocab_size)));
    for (size_t i = 0; e->HasUnfinished(); ++i) {
      const auto t0 = Clock::now();
      TANDEM_RETURN_IF_ERROR(e->Step().status());
      if (times.size() <= i) times.resize(i + 1);
      times[i].push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  std::vector<planner::StepSample> samples;
  for (size_t i = 0; i < times.size(); ++i) {
    const int64_t context = static_cast<int64_t>(i) * chunk;
    samples.push_back({std::min<int64_t>(chunk, len - context), context, Median(times[i])});
  }
  return samples;
}

// Decode: `batch` sequences of `context`-token prompts, prefilled untimed, then `steps` decode
// steps timed one by one; one sample at the batch's total context in the middle of those steps.
// The engine decodes the sequences it has prefilled while it prefills the others, so each gets
// room for a token per prefill step besides the timed ones: none may leave the batch before the
// timing ends (the context is shortened where the model's length leaves too little room), and
// the sample counts what each has generated by then. An error if a step ran fewer sequences.
absl::StatusOr<planner::StepSample> ProfileDecode(model::Model& m, int batch, int context,
                                                  int steps) {
  engine::EngineOptions o;
  o.max_num_seqs = batch;
  o.enable_prefix_caching = false;
  const int prefill_steps =
      batch * ((context + o.max_num_batched_tokens - 1) / o.max_num_batched_tokens) + 1;
  const int max_tokens = steps + 2 + prefill_steps;
  const int64_t limit = m.config().max_position_embeddings;
  context = static_cast<int>(std::min<int64_t>(context, limit - max_tokens));
  if (context < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile: decode batch ", batch, " leaves no room for a prompt in ", limit, " positions"));
  }
  o.num_blocks = batch * ((context + max_tokens) / o.block_size + 2);
  TANDEM_ASSIGN_OR_RETURN(auto e, engine::Engine::Create(m, o));
  for (int i = 0; i < batch; ++i) {
    TANDEM_RETURN_IF_ERROR(e->AddRequest(
        MakeRequest(absl::StrCat("d", i), context, max_tokens, m.config().vocab_size)));
  }
  absl::flat_hash_map<std::string, int> generated;  // tokens per sequence so far
  auto count = [&](const std::vector<engine::RequestOutput>& outs) {
    for (const auto& out : outs) generated[out.id] = out.completion_tokens;
  };
  int produced = 0;
  while (produced < batch) {
    TANDEM_ASSIGN_OR_RETURN(auto outs, e->Step());
    for (const auto& out : outs) produced += out.completion_tokens == 1;
    count(outs);
  }
  std::vector<double> times;
  int64_t total_context = 0;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = Clock::now();
    TANDEM_ASSIGN_OR_RETURN(auto outs, e->Step());
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (static_cast<int>(outs.size()) != batch || e->NumRunning() != batch) {
      return absl::InternalError(absl::StrCat("profile: decode batch ", batch, " at ", context,
                                              " tokens: a timed step ran ", outs.size(),
                                              " sequences"));
    }
    count(outs);
    if (s == steps / 2) {
      for (const auto& [id, n] : generated) total_context += context + n;
    }
  }
  return planner::StepSample{batch, total_context, Median(times)};
}

std::string CpuName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      return std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
    }
  }
  return "unknown CPU";
}

absl::Status WriteProfile(model::Model& m, const CliArgs& args, ThreadPool& pool,
                          const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(int64_t max_context, args.IntOr("profile-max-context", 2048));
  TANDEM_ASSIGN_OR_RETURN(int64_t budget, args.IntOr("profile-decode-tokens", 32768));
  TANDEM_ASSIGN_OR_RETURN(int64_t repeats, args.IntOr("repeats", 3));
  std::vector<int32_t> chunks = {16, 64, 256, 1024}, batches = {1, 2, 4, 8, 16, 32},
                       contexts = {64, 512, 2048};
  if (args.Has("profile-chunks")) {
    TANDEM_ASSIGN_OR_RETURN(chunks, args.IntList("profile-chunks"));
  }
  if (args.Has("batches")) {
    TANDEM_ASSIGN_OR_RETURN(batches, args.IntList("batches"));
  }
  if (args.Has("profile-contexts")) {
    TANDEM_ASSIGN_OR_RETURN(contexts, args.IntList("profile-contexts"));
  }
  // The model's context bounds every prompt (a prompt needs room for its first token, a decode
  // for its steps).
  const int64_t limit = m.config().max_position_embeddings;
  max_context = std::min(max_context, limit - 1);
  for (auto& c : contexts) c = static_cast<int32_t>(std::min<int64_t>(c, limit - 16));
  planner::EngineProfile p;
  p.machine = absl::StrCat(CpuName(), ", ", pool.num_threads(), " threads");
  p.created = absl::FormatTime("%Y-%m-%d", absl::Now(), absl::UTCTimeZone());
  p.threads = pool.num_threads();
  p.model = std::filesystem::path(args.StringOr("model", "")).filename().string();
  p.weights = m.weights().format();
  p.cpu_gemm = m.weights().cpu_gemm;
  p.kv_dtype = std::string(DTypeName(engine::EngineOptions{}.kv_dtype));
  p.parameters = m.config().ParameterCount();
  p.num_layers = p.pop_start_layer = m.config().num_layers;
  p.block_size = engine::EngineOptions{}.block_size;
  p.kv_bytes_per_token =
      m.config().KvLayoutFor(engine::EngineOptions{}.kv_dtype, p.block_size).BytesPerToken();
  for (int chunk : chunks) {
    if (chunk < 1 || chunk > max_context) continue;
    // A whole number of chunks, so every sample of a chunk size has the same token count.
    const int len = static_cast<int>(max_context / chunk * chunk);
    TANDEM_ASSIGN_OR_RETURN(auto samples, ProfilePrefill(m, len, chunk, static_cast<int>(repeats)));
    std::fprintf(stderr, "profile: prefill in chunks of %d: %zu samples\n", chunk, samples.size());
    p.prefill.insert(p.prefill.end(), samples.begin(), samples.end());
  }
  for (int context : contexts) {
    for (int batch : batches) {
      if (batch < 1 || context < 1 || int64_t{batch} * context > budget) continue;
      TANDEM_ASSIGN_OR_RETURN(auto sample, ProfileDecode(m, batch, context, 8));
      std::fprintf(stderr, "profile: decode batch %d at %lld tokens: %.2f ms a step\n", batch,
                   static_cast<long long>(sample.context / batch), sample.seconds * 1e3);
      p.decode.push_back(sample);
    }
  }
  // What the simulator will read back must parse and fit.
  const std::string json = p.ToJson();
  TANDEM_RETURN_IF_ERROR(planner::EngineProfile::FromJson(json, path).status());
  return WriteStringToFile(path, json + "\n");
}

absl::Status Run(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags(
      {"model", "prompt-lens", "batches", "decode-steps", "repeats", "threads", "skip-bandwidth",
       "weight-memory", "cpu-gemm", "prune-ratios", "device", "profile-out", "profile-max-context",
       "profile-decode-tokens", "profile-chunks", "profile-contexts"})));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  std::vector<int32_t> lens = {128, 512, 2048}, batches = {1, 8, 32};
  if (args.Has("prompt-lens")) {
    TANDEM_ASSIGN_OR_RETURN(lens, args.IntList("prompt-lens"));
  }
  if (args.Has("batches")) {
    TANDEM_ASSIGN_OR_RETURN(batches, args.IntList("batches"));
  }
  TANDEM_ASSIGN_OR_RETURN(int64_t steps, args.IntOr("decode-steps", 32));
  TANDEM_ASSIGN_OR_RETURN(int64_t repeats, args.IntOr("repeats", 3));
  TANDEM_ASSIGN_OR_RETURN(int64_t threads, args.IntOr("threads", 0));
  ThreadPool pool(static_cast<int>(threads));
  model::WeightLoadOptions load;
  TANDEM_ASSIGN_OR_RETURN(load.memory,
                          model::ParseWeightMemory(args.StringOr("weight-memory", "mmap")));
  TANDEM_ASSIGN_OR_RETURN(load.device, kernels::ParseDevice(args.StringOr("device", "cpu")));
  TANDEM_RETURN_IF_ERROR(model::QuantizationFromFlags(args, load));
  TANDEM_ASSIGN_OR_RETURN(load.cpu_gemm, kernels::ParseCpuGemm(args.StringOr("cpu-gemm", "auto")));
  TANDEM_ASSIGN_OR_RETURN(auto model, model::Model::Load(dir, pool, load));
  if (args.Has("profile-out")) {
    TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("profile-out"));
    return WriteProfile(*model, args, pool, path);
  }
  const bool on_cpu = load.device.kind == kernels::DeviceSpec::Kind::kCpu;
  // The decode pass reads every matrix but the embedding (only rows are gathered from it), in
  // the form it has in memory (quantized: codes and scales).
  const auto& emb = model->weights().embed_tokens;
  double read_bytes = static_cast<double>(model->weights().memory_bytes);
  if (model->weights().lm_head.data != emb.data) read_bytes -= kernels::MatrixBytes(emb);
  std::optional<BandwidthProbe> probe;
  double bw = 0;
  if (on_cpu && !args.Has("skip-bandwidth")) {
    TANDEM_ASSIGN_OR_RETURN(probe, BandwidthProbe::Create(load.memory));
    bw = probe->Measure(pool, 5);
  }
  std::printf("model: %s, %.1f M parameters, %s weights (%.1f MiB read per decode step)\n",
              dir.c_str(), model->config().ParameterCount() / 1e6,
              model->weights().format().c_str(), read_bytes / (1 << 20));
  std::printf("backend: %s; cpu gemm: %s%s\n", model->backend().Describe().c_str(),
              model->weights().cpu_gemm.c_str(),
              model->weights().cpu_gemm_implementation.empty()
                  ? ""
                  : (", " + model->weights().cpu_gemm_implementation).c_str());
  std::printf("threads: %d, weight memory: %s, measured read bandwidth: %.2f GB/s\n\n",
              pool.num_threads(), args.StringOr("weight-memory", "mmap").c_str(), bw / 1e9);
  std::printf(
      "| phase | size | tokens/s (median of %lld) | bandwidth bound tokens/s | of bound |\n",
      static_cast<long long>(repeats));
  std::printf("|---|---|---|---|---|\n");
  for (int len : lens) {
    std::vector<double> rates;
    for (int r = 0; r < repeats; ++r) {
      TANDEM_ASSIGN_OR_RETURN(double s, TimePrefill(*model, len, r));
      rates.push_back(len / s);
    }
    std::printf("| prefill | %d-token prompt | %.1f | | |\n", len, Median(rates));
    std::fflush(stdout);
  }
  for (int b : batches) {
    std::vector<double> rates, bounds, fractions;
    for (int r = 0; r < repeats; ++r) {
      const double bound = probe ? b * probe->Measure(pool) / read_bytes : 0;
      TANDEM_ASSIGN_OR_RETURN(double rate, TimeDecode(*model, b, static_cast<int>(steps)));
      rates.push_back(rate);
      bounds.push_back(bound);
      fractions.push_back(bound > 0 ? rate / bound : 0);
    }
    std::printf("| decode | batch %d | %.1f | %.1f | %.0f%% |\n", b, Median(rates), Median(bounds),
                100 * Median(fractions));
    std::fflush(stdout);
  }
  if (args.Has("prune-ratios")) {
    std::vector<double> ratios;
    const std::string list = args.StringOr("prune-ratios", "");
    for (absl::string_view part : absl::StrSplit(list, ',')) {
      double ratio = 0;
      if (!absl::SimpleAtod(part, &ratio) || !(ratio >= 0 && ratio <= 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prune-ratios: '", part, "' is not a ratio in [0, 1]"));
      }
      ratios.push_back(ratio);
    }
    TANDEM_RETURN_IF_ERROR(RunPruning(*model, lens, ratios, static_cast<int>(repeats)));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::bench

namespace {

constexpr char kUsage[] = R"(usage: engine-bench --model DIR [options]
  end-to-end prefill and decode tokens/s of the engine on a model directory, with the
  memory-bandwidth bound beside each decode figure; prints a Markdown table
  --prompt-lens 128,512,2048      prefill rows: one prompt of each length
  --batches 1,8,32                decode rows: that many sequences decoding together
  --decode-steps 32 --repeats 3   steps per decode measurement; medians over the repeats
  --threads N                     (default: TANDEM_NUM_THREADS or all cores)
  --weight-memory mmap|hugepages  (default mmap)
  --weight-quantization none|int8|int4 [--weight-quantization-group-size G]
  --activation-quantization none|int8|int8-token   (as model.activation_quantization)
  --lm-head-quantization none|int8      (int8: as model.lm_head_quantization)
  --cpu-gemm auto|tandem|onednn   (default auto: as model.cpu_gemm)
  --prune-ratios 0.25,0.5         POP rows: the last R of the layers pruned, against unpruned
  --device cpu|cuda|cuda:N        (a device other than the CPU implies --skip-bandwidth)
  --skip-bandwidth                no bandwidth probe or bound column
  --profile-out FILE.json         instead of the table, measure the step times the planner
                                  needs and write them as an engine profile (docs/planner.md):
    --profile-chunks 16,64,256,1024   prefill: one prompt of --profile-max-context tokens
    --profile-max-context 2048        (default 2048) in chunks of each size, every step timed
    --batches 1,2,4,8,16,32           decode: each batch size at each prompt length of
    --profile-contexts 64,512,2048    --profile-contexts, batch x length at most
    --profile-decode-tokens 32768     --profile-decode-tokens; 8 steps timed each
    --repeats 3                       prefill: the median of this many runs
)";

}  // namespace

int main(int argc, char** argv) {
  auto args = tandem::CliArgs::Parse(argc, argv, {"skip-bandwidth", "help"});
  if (args.ok() && args->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  absl::Status s = args.ok() ? tandem::bench::Run(*args) : args.status();
  if (!s.ok()) {
    std::fprintf(stderr, "engine-bench: %s\n%s", s.ToString().c_str(), kUsage);
    return 1;
  }
  return 0;
}
