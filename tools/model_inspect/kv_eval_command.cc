// model-inspect kv-eval: what a compressed KV cache (int8, or mixed fp16 + int8) costs against
// an fp16 one, on a text. Each window's prompt is prefilled into both caches, then
//  - teacher-forced: both decode the fp16 cache's greedy continuation token by token, and each
//    step's attention output (o_proj) per layer and its logits are compared;
//  - free-running: the evaluated cache generates its own greedy tokens, which are compared with
//    the fp16 cache's, position by position.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_cache_manager.h"
#include "common/kv/kv_eviction.h"
#include "common/model/model.h"
#include "common/model/pruning_check.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "tools/model_inspect/commands.h"
#include "tools/model_inspect/text_windows.h"

namespace tandem::tools {
namespace {

// How a run's cache is set up: its dtype, mixed precision and eviction.
struct CacheSpec {
  DType dtype = DType::kF16;
  engine::EngineOptions::MixedKv mixed;
  kv::EvictionPolicy eviction;
};

// One sequence in its own cache, stepped token by token.
class CacheRun {
 public:
  static absl::StatusOr<CacheRun> Create(model::Model& model, const CacheSpec& spec,
                                         int64_t capacity) {
    kv::KvCacheOptions o;
    o.layout = model.config().KvLayoutFor(spec.dtype, 16);
    o.num_blocks = (capacity + 15) / 16;
    if (spec.mixed.enabled) {
      o.mixed = {.narrow_blocks = o.num_blocks,
                 .sink_tokens = spec.mixed.sink_tokens,
                 .window_tokens = spec.mixed.window_tokens};
    }
    o.model_id = "kv-eval";
    o.enable_prefix_caching = false;
    TANDEM_ASSIGN_OR_RETURN(auto kv, kv::KvCacheManager::Create(o));
    return CacheRun(model, std::move(kv), spec.eviction);
  }

  // Runs `tokens` (the prompt, or one generated token) and leaves the last row's logits.
  absl::Status Step(std::span<const int32_t> tokens, model::ForwardProbe* probe) {
    if (tokens_.empty()) TANDEM_RETURN_IF_ERROR(kv_->AddSequence(1, tokens).status());
    const int64_t start = static_cast<int64_t>(tokens_.size());
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    TANDEM_RETURN_IF_ERROR(kv_->Reserve(1, static_cast<int>(tokens_.size())));
    const model::ForwardSequence seq{.tokens = tokens.data(),
                                     .num_tokens = static_cast<int>(tokens.size()),
                                     .start_pos = start,
                                     .block_table = kv_->BlockTableData(1),
                                     .logits = model::LogitsMode::kLast};
    TANDEM_RETURN_IF_ERROR(model_->Forward({&seq, 1}, kv_->arena(), logits_, nullptr, probe));
    kv_->CommitTokens(1, tokens_, static_cast<int>(tokens_.size()));
    eviction_.Apply(*kv_, 1, static_cast<int>(tokens_.size()));
    return absl::OkStatus();
  }

  // -log2 of the probability the last row's logits give `token`.
  double Bits(int32_t token) const {
    const float max = *std::max_element(logits_.begin(), logits_.end());
    double sum = 0;
    for (float x : logits_) sum += std::exp(double{x} - max);
    return (std::log(sum) - (double{logits_[token]} - max)) / std::log(2.0);
  }

  const std::vector<float>& logits() const { return logits_; }
  int32_t Greedy() const { return Argmax(logits_.data(), static_cast<int64_t>(logits_.size())); }

 private:
  CacheRun(model::Model& model, std::unique_ptr<kv::KvCacheManager> kv,
           const kv::EvictionPolicy& eviction)
      : model_(&model), kv_(std::move(kv)), eviction_(eviction) {}

  model::Model* model_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  kv::SequenceEviction eviction_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
};

// max |a - b| / std(a).
double RelativeMaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double mean = 0, var = 0, diff = 0;
  for (float x : a) mean += x;
  mean /= static_cast<double>(a.size());
  for (float x : a) var += (x - mean) * (x - mean);
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(double{a[i]} - b[i]));
  return diff / std::sqrt(var / static_cast<double>(a.size()));
}

struct Totals {
  int64_t greedy_same = 0, greedy_total = 0, windows_identical = 0;
  int64_t argmax_same = 0, steps = 0;
  double max_logit_diff = 0;
  std::vector<double> cosine_sum, cosine_min;
  int64_t cosine_n = 0;
  double base_bits = 0, eval_bits = 0;  // of the text's continuation, teacher-forced
  int64_t continuation_bytes = 0;
};

// Bits of the text's own continuation of the window under a cache: the prompt prefilled, then
// each true token fed in turn.
absl::StatusOr<double> ContinuationBits(model::Model& model, const CacheSpec& spec,
                                        const Window& w) {
  TANDEM_ASSIGN_OR_RETURN(
      CacheRun run,
      CacheRun::Create(model, spec, static_cast<int64_t>(w.prompt.size() + w.continuation.size())));
  TANDEM_RETURN_IF_ERROR(run.Step(w.prompt, nullptr));
  double bits = 0;
  for (size_t i = 0; i < w.continuation.size(); ++i) {
    bits += run.Bits(w.continuation[i]);
    if (i + 1 < w.continuation.size()) {
      TANDEM_RETURN_IF_ERROR(run.Step({&w.continuation[i], 1}, nullptr));
    }
  }
  return bits;
}

// One window: the base cache's greedy stream, the evaluated cache teacher-forced on it and
// free-running.
absl::Status EvalWindow(model::Model& model, const CacheSpec& base, const CacheSpec& eval,
                        const Window& w, int64_t steps, Totals& t) {
  const int64_t capacity = static_cast<int64_t>(w.prompt.size()) + steps;
  TANDEM_ASSIGN_OR_RETURN(CacheRun ref, CacheRun::Create(model, base, capacity));
  TANDEM_ASSIGN_OR_RETURN(CacheRun forced, CacheRun::Create(model, eval, capacity));
  TANDEM_ASSIGN_OR_RETURN(CacheRun free, CacheRun::Create(model, eval, capacity));
  TANDEM_RETURN_IF_ERROR(ref.Step(w.prompt, nullptr));
  TANDEM_RETURN_IF_ERROR(forced.Step(w.prompt, nullptr));
  TANDEM_RETURN_IF_ERROR(free.Step(w.prompt, nullptr));
  int32_t want = ref.Greedy(), got = free.Greedy();
  int64_t same = want == got;
  model::ForwardProbe probe_ref, probe_eval;
  probe_ref.record = probe_eval.record = model::ForwardProbe::Record::kLastRow;
  for (int64_t i = 1; i < steps; ++i) {
    TANDEM_RETURN_IF_ERROR(ref.Step({&want, 1}, &probe_ref));
    TANDEM_RETURN_IF_ERROR(forced.Step({&want, 1}, &probe_eval));
    TANDEM_RETURN_IF_ERROR(free.Step({&got, 1}, nullptr));
    want = ref.Greedy();
    got = free.Greedy();
    same += want == got;
    t.argmax_same += forced.Greedy() == want;
    ++t.steps;
    t.max_logit_diff = std::max(t.max_logit_diff, RelativeMaxDiff(ref.logits(), forced.logits()));
    const size_t layers = probe_ref.attention.size();
    t.cosine_sum.resize(layers, 0.0);
    t.cosine_min.resize(layers, 1.0);
    for (size_t l = 0; l < layers; ++l) {
      const double c =
          model::CosineSimilarity(probe_ref.attention[l].data(), probe_eval.attention[l].data(),
                                  static_cast<int64_t>(probe_ref.attention[l].size()));
      t.cosine_sum[l] += c;
      t.cosine_min[l] = std::min(t.cosine_min[l], c);
    }
    ++t.cosine_n;
  }
  t.greedy_same += same;
  t.greedy_total += steps;
  t.windows_identical += same == steps;
  TANDEM_ASSIGN_OR_RETURN(const double base_bits, ContinuationBits(model, base, w));
  TANDEM_ASSIGN_OR_RETURN(const double eval_bits, ContinuationBits(model, eval, w));
  t.base_bits += base_bits;
  t.eval_bits += eval_bits;
  t.continuation_bytes += w.continuation_bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status RunKvEval(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags(
      {"model", "text-file", "prompt-tokens", "continuation-tokens", "windows", "kv-dtype", "base",
       "kv-sink-tokens", "kv-window-tokens", "evict-budget-tokens", "evict-sink-tokens",
       "evict-policy", "evict-shift-threshold", "threads", "weight-memory", "cpu-gemm"})));
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("text-file"));
  TANDEM_ASSIGN_OR_RETURN(WindowFlags flags, ParseWindowFlags(args, 256, 64));
  TANDEM_ASSIGN_OR_RETURN(TextEvalInputs in, LoadTextEval(args, path));
  const std::string& text = in.text;
  const std::string& dir = in.dir;
  auto& tok = in.tokenizer;
  auto& model = in.model;
  const auto& c = model->config();
  if (flags.prompt_tokens + flags.continuation_tokens > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-tokens plus --continuation-tokens must fit the model's context (",
                     c.max_position_embeddings, ")"));
  }
  const std::string base_name = args.StringOr("base", "fp16");
  const std::string eval_name = args.StringOr("kv-dtype", base_name);
  if (base_name == "mixed") {
    return absl::InvalidArgumentError("--base must be a plain dtype (fp32, fp16, bf16, int8)");
  }
  CacheSpec base, eval;
  TANDEM_ASSIGN_OR_RETURN(base.dtype, ParseKvDType(base_name));
  eval.dtype = base.dtype;
  if (args.Has("kv-dtype")) {
    TANDEM_ASSIGN_OR_RETURN(eval.dtype, KvDType(args, c));
  }
  TANDEM_ASSIGN_OR_RETURN(eval.mixed, MixedKvFromFlags(args));
  TANDEM_ASSIGN_OR_RETURN(eval.eviction, EvictionFromFlags(args));
  const engine::EngineOptions::MixedKv& mixed = eval.mixed;
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<Window> windows,
      CutWindows(*tok, text, static_cast<int>(flags.prompt_tokens),
                 static_cast<int>(flags.continuation_tokens), static_cast<int>(flags.windows)));
  Totals t;
  for (const Window& w : windows) {
    TANDEM_RETURN_IF_ERROR(EvalWindow(*model, base, eval, w, flags.continuation_tokens, t));
  }
  std::string what = eval_name;
  if (mixed.enabled) {
    what = absl::StrCat("mixed (sink ", mixed.sink_tokens, ", window ", mixed.window_tokens, ")");
  }
  if (const kv::EvictionPolicy& ev = eval.eviction; ev.budget_tokens > 0) {
    absl::StrAppend(&what, ", ", ev.semantic ? "semantic" : "sliding", " eviction (budget ",
                    ev.budget_tokens, ", sink ", ev.sink_tokens,
                    ev.semantic ? absl::StrCat(", shift ", ev.shift_threshold) : "", ")");
  }
  std::printf("kv-eval: %s, %zu windows of %lld prompt + %lld generated tokens; %s against %s\n",
              dir.c_str(), windows.size(), static_cast<long long>(flags.prompt_tokens),
              static_cast<long long>(flags.continuation_tokens), what.c_str(), base_name.c_str());
  std::printf("greedy agreement (free-running): %.4f (%lld/%zu windows identical)\n",
              static_cast<double>(t.greedy_same) / static_cast<double>(t.greedy_total),
              static_cast<long long>(t.windows_identical), windows.size());
  const double bytes = static_cast<double>(std::max<int64_t>(t.continuation_bytes, 1));
  std::printf(
      "bits per byte of the text's continuation (teacher-forced): %s %.4f, evaluated "
      "%.4f (%+.2f%%)\n",
      base_name.c_str(), t.base_bits / bytes, t.eval_bits / bytes,
      100.0 * (t.eval_bits / std::max(t.base_bits, 1e-9) - 1.0));
  if (t.steps == 0) return absl::OkStatus();
  std::printf(
      "teacher-forced, %lld decode steps: argmax agreement %.4f, max |logit diff|/std "
      "%.4f\n",
      static_cast<long long>(t.steps),
      static_cast<double>(t.argmax_same) / static_cast<double>(t.steps), t.max_logit_diff);
  double mean = 0, worst = 1;
  for (size_t l = 0; l < t.cosine_sum.size(); ++l) {
    const double m = t.cosine_sum[l] / static_cast<double>(t.cosine_n);
    std::printf("layer %zu: attention-output cosine mean %.6f, min %.6f\n", l, m, t.cosine_min[l]);
    mean += m / static_cast<double>(t.cosine_sum.size());
    worst = std::min(worst, t.cosine_min[l]);
  }
  std::printf("attention-output cosine over all layers: mean %.6f, min %.6f\n", mean, worst);
  return absl::OkStatus();
}

}  // namespace tandem::tools
