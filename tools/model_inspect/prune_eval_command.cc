// model-inspect prune-eval: what prefill-only pruning (POP) costs in quality, and what its two
// safeguards are worth. Each window of a text is a prompt and its true continuation; the prompt
// is prefilled four ways (full, POP, POP without boundary handling, POP without independent KV)
// and the continuation then runs at full depth on the cache that prefill left, as a decode
// worker would run it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "tools/model_inspect/commands.h"

namespace tandem::tools {
namespace {

// How the prompt is prefilled.
enum class Variant {
  kFull,             // every layer for every token: the reference
  kPop,              // POP as Tandem runs it
  kNoBoundary,       // POP, but the last prompt token is pruned too (no boundary handling)
  kNoIndependentKv,  // POP, but pruned tokens leave their K/V in the pruned layers unwritten
                     // (zero)
};
constexpr std::array kVariants = {Variant::kFull, Variant::kPop, Variant::kNoBoundary,
                                  Variant::kNoIndependentKv};

std::string_view VariantName(Variant v) {
  switch (v) {
    case Variant::kFull: return "full";
    case Variant::kPop: return "pop";
    case Variant::kNoBoundary: return "pop-no-boundary";
    case Variant::kNoIndependentKv: return "pop-no-independent-kv";
  }
  return "?";
}

struct Window {
  std::vector<int32_t> prompt;        // BOS (when the model has one) and the window's first tokens
  std::vector<int32_t> continuation;  // the tokens that follow in the text
  int64_t continuation_bytes = 0;     // UTF-8 bytes of the continuation's text
};

// One window under one variant.
struct WindowResult {
  std::vector<double> first_log_probs;  // log-softmax of the first-token logits
  double continuation_bits = 0;         // -log2 p of the true continuation, teacher-forced
  std::vector<int32_t> greedy;          // greedy tokens from the prefilled cache
};

// Sums of one variant over the windows.
struct Totals {
  double bits = 0;
  int64_t bytes = 0;
  int64_t tokens = 0;
  double kl = 0;
  int64_t first_argmax_same = 0;
  int64_t greedy_same = 0;
  int64_t greedy_total = 0;
  int64_t greedy_prefix = 0;
};

std::vector<double> LogSoftmax(const float* logits, int64_t n) {
  double max = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - max);
  const double log_z = max + std::log(sum);
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - log_z;
  return out;
}

int32_t Argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// KL(p || q) in nats from log-probabilities.
double KlDivergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  return kl;
}

class PruneEvaluator {
 public:
  PruneEvaluator(model::Model& model, DType kv_dtype, int64_t max_positions,
                 const model::PruningSettings& settings)
      : model_(model),
        settings_(settings),
        layout_(model.config().KvLayoutFor(kv_dtype, 16)),
        pruned_layers_(model::PrunedLayers(settings, model.config().num_layers)) {
    const int64_t blocks = (max_positions + layout_.block_size - 1) / layout_.block_size;
    kv_.resize(blocks * layout_.BlockBytes());
    for (int64_t b = 0; b < blocks; ++b) block_table_.push_back(static_cast<int32_t>(b));
  }

  const std::vector<uint8_t>& pruned_layers() const { return pruned_layers_; }

  absl::StatusOr<WindowResult> Run(const Window& w, Variant variant, int greedy_tokens) {
    std::fill(kv_.begin(), kv_.end(), 0);
    const int64_t vocab = model_.config().vocab_size;
    const int64_t p = static_cast<int64_t>(w.prompt.size());
    WindowResult r;

    // Prefill.
    std::vector<uint8_t> full_depth = FullDepthPositions(w.prompt, settings_, model_.config());
    if (variant == Variant::kNoBoundary) full_depth.back() = 0;
    if (variant == Variant::kNoIndependentKv) {
      // Each run of pruned positions, then its K/V in pruned layers cleared, then the next
      // full-depth position alone: every full-depth token attends to what such a cache holds.
      int64_t run = 0;
      for (int64_t i = 0; i < p; ++i) {
        if (!full_depth[i]) continue;
        if (run < i) {
          const std::vector<uint8_t> pruned_rows(i - run, 0);
          const model::PruningPlan plan{pruned_layers_, pruned_rows};
          TANDEM_RETURN_IF_ERROR(
              Forward(&w.prompt[run], i - run, run, model::LogitsMode::kNone, &plan));
          ClearPrunedKv(run, i);
        }
        TANDEM_RETURN_IF_ERROR(Forward(&w.prompt[i], 1, i,
                                       i == p - 1 ? model::LogitsMode::kLast
                                                  : model::LogitsMode::kNone,
                                       nullptr));
        run = i + 1;
      }
    } else {
      const model::PruningPlan plan{pruned_layers_, full_depth};
      TANDEM_RETURN_IF_ERROR(Forward(w.prompt.data(), p, 0, model::LogitsMode::kLast,
                                     variant == Variant::kFull ? nullptr : &plan));
    }
    const std::vector<float> first(logits_.begin(), logits_.begin() + vocab);
    r.first_log_probs = LogSoftmax(first.data(), vocab);

    // The true continuation at full depth, one chunk (as exact as decoding it token by token).
    const auto& cont = w.continuation;
    r.continuation_bits = -r.first_log_probs[cont[0]];
    if (cont.size() > 1) {
      TANDEM_RETURN_IF_ERROR(Forward(cont.data(), static_cast<int64_t>(cont.size()) - 1, p,
                                     model::LogitsMode::kAll, nullptr));
      for (size_t i = 0; i + 1 < cont.size(); ++i) {
        r.continuation_bits -= LogSoftmax(logits_.data() + i * vocab, vocab)[cont[i + 1]];
      }
    }
    r.continuation_bits /= std::log(2.0);

    // Greedy decode from the prefilled cache (it overwrites the continuation's positions in
    // order, and attention never reads past the position being written).
    int32_t token = Argmax(first.data(), vocab);
    r.greedy.push_back(token);
    for (int g = 1; g < greedy_tokens; ++g) {
      TANDEM_RETURN_IF_ERROR(Forward(&token, 1, p + g - 1, model::LogitsMode::kLast, nullptr));
      token = Argmax(logits_.data(), vocab);
      r.greedy.push_back(token);
    }
    return r;
  }

 private:
  absl::Status Forward(const int32_t* tokens, int64_t n, int64_t start, model::LogitsMode mode,
                       const model::PruningPlan* plan) {
    const model::ForwardSequence seq{.tokens = tokens,
                                     .num_tokens = static_cast<int>(n),
                                     .start_pos = start,
                                     .block_table = block_table_.data(),
                                     .logits = mode};
    return model_.Forward({&seq, 1}, kv_.data(), layout_, logits_, plan);
  }

  // The ablation: in pruned layers, the K/V slots of positions begin..end-1 left as a cache
  // without independent KV projections would hold them (zero: scores of 0, values of 0).
  void ClearPrunedKv(int64_t begin, int64_t end) {
    const size_t row = static_cast<size_t>(layout_.head_dim) * layout_.ElementBytes();
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      if (!pruned_layers_[layer]) continue;
      for (int64_t pos = begin; pos < end; ++pos) {
        uint8_t* block = kv_.data() + (pos / layout_.block_size) * layout_.BlockBytes();
        const size_t in_block = (pos % layout_.block_size) * row;
        for (int h = 0; h < layout_.num_kv_heads; ++h) {
          std::memset(block + layout_.KOffset(layer, h) + in_block, 0, row);
          std::memset(block + layout_.VOffset(layer, h) + in_block, 0, row);
        }
      }
    }
  }

  model::Model& model_;
  const model::PruningSettings settings_;
  const kv::KvLayout layout_;
  const std::vector<uint8_t> pruned_layers_;
  std::vector<uint8_t> kv_;
  std::vector<int32_t> block_table_;
  std::vector<float> logits_;
};

// Consecutive, non-overlapping windows of the text's tokens.
absl::StatusOr<std::vector<Window>> CutWindows(const tokenizer::Tokenizer& tok,
                                               const std::string& text, int prompt_tokens,
                                               int continuation_tokens, int max_windows) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, /*add_special=*/false));
  const int bos = tok.bos_id() >= 0 ? 1 : 0;
  const size_t stride = static_cast<size_t>(prompt_tokens - bos + continuation_tokens);
  std::vector<Window> windows;
  for (size_t start = 0; start + stride <= ids.size() && static_cast<int>(windows.size()) <
                                                              max_windows;
       start += stride) {
    Window w;
    if (bos) w.prompt.push_back(tok.bos_id());
    const auto mid = ids.begin() + start + (prompt_tokens - bos);
    w.prompt.insert(w.prompt.end(), ids.begin() + start, mid);
    w.continuation.assign(mid, mid + continuation_tokens);
    TANDEM_ASSIGN_OR_RETURN(std::string bytes,
                            tok.DecodeBytes(w.continuation, /*skip_special_tokens=*/false));
    w.continuation_bytes = static_cast<int64_t>(bytes.size());
    windows.push_back(std::move(w));
  }
  if (windows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the text has ", ids.size(), " tokens, fewer than one window of ", stride));
  }
  return windows;
}

std::string LayerList(const std::vector<uint8_t>& pruned) {
  std::vector<int> layers;
  for (size_t i = 0; i < pruned.size(); ++i) {
    if (pruned[i]) layers.push_back(static_cast<int>(i));
  }
  return layers.empty() ? "none" : absl::StrJoin(layers, ",");
}

}  // namespace

absl::Status RunPruneEval(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(
      {"model", "text-file", "prompt-tokens", "continuation-tokens", "greedy-tokens", "windows",
       "json", "kv-dtype", "threads", "weight-memory", "prune-start-layer", "prune-ratio",
       "prune-keep-every", "protect-tokens"}));
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("text-file"));
  TANDEM_ASSIGN_OR_RETURN(int64_t prompt_tokens, args.IntOr("prompt-tokens", 512));
  TANDEM_ASSIGN_OR_RETURN(int64_t continuation_tokens, args.IntOr("continuation-tokens", 128));
  TANDEM_ASSIGN_OR_RETURN(int64_t greedy_tokens, args.IntOr("greedy-tokens", 32));
  TANDEM_ASSIGN_OR_RETURN(int64_t max_windows, args.IntOr("windows", 8));
  constexpr int64_t kLimit = 1 << 20;
  if (prompt_tokens < 2 || prompt_tokens > kLimit || continuation_tokens < 1 ||
      continuation_tokens > kLimit || greedy_tokens < 1 || greedy_tokens > kLimit ||
      max_windows < 1 || max_windows > kLimit) {
    return absl::InvalidArgumentError(
        "--prompt-tokens must be >= 2; --continuation-tokens, --greedy-tokens and --windows >= 1");
  }
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::Load(dir));
  TANDEM_ASSIGN_OR_RETURN(auto pool, MakePool(args));
  TANDEM_ASSIGN_OR_RETURN(auto model, LoadModel(args, *pool));
  const auto& c = model->config();
  if (prompt_tokens + std::max(continuation_tokens, greedy_tokens) > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt-tokens plus the longer of --continuation-tokens and --greedy-tokens must fit "
        "the model's context (",
        c.max_position_embeddings, ")"));
  }
  model::PruningSettings settings;
  TANDEM_ASSIGN_OR_RETURN(bool prune, PruningFromFlags(args, c.num_layers, &settings));
  if (!prune) return absl::InvalidArgumentError("give --prune-start-layer or --prune-ratio");
  TANDEM_ASSIGN_OR_RETURN(DType kv_dtype, KvDType(args, c));
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<Window> windows,
      CutWindows(*tok, text, static_cast<int>(prompt_tokens),
                 static_cast<int>(continuation_tokens), static_cast<int>(max_windows)));

  PruneEvaluator eval(*model, kv_dtype,
                      prompt_tokens + std::max(continuation_tokens, greedy_tokens), settings);
  std::array<Totals, kVariants.size()> totals{};
  for (const Window& w : windows) {
    std::vector<WindowResult> results;
    for (Variant v : kVariants) {
      TANDEM_ASSIGN_OR_RETURN(WindowResult r, eval.Run(w, v, static_cast<int>(greedy_tokens)));
      results.push_back(std::move(r));
    }
    const WindowResult& full = results[0];
    for (size_t v = 0; v < kVariants.size(); ++v) {
      const WindowResult& r = results[v];
      Totals& t = totals[v];
      t.bits += r.continuation_bits;
      t.bytes += w.continuation_bytes;
      t.tokens += static_cast<int64_t>(w.continuation.size());
      t.kl += KlDivergence(full.first_log_probs, r.first_log_probs);
      t.first_argmax_same += r.greedy[0] == full.greedy[0];
      const auto mismatch = std::mismatch(r.greedy.begin(), r.greedy.end(), full.greedy.begin());
      t.greedy_prefix += mismatch.first - r.greedy.begin();
      for (size_t i = 0; i < r.greedy.size(); ++i) t.greedy_same += r.greedy[i] == full.greedy[i];
      t.greedy_total += static_cast<int64_t>(r.greedy.size());
    }
  }

  const double n = static_cast<double>(windows.size());
  const std::string layers = LayerList(eval.pruned_layers());
  if (args.Has("json")) {
    std::vector<std::string> rows;
    for (size_t v = 0; v < kVariants.size(); ++v) {
      const Totals& t = totals[v];
      rows.push_back(absl::StrFormat(
          "{\"variant\": \"%s\", \"bits_per_byte\": %.6f, \"bits_per_token\": %.6f, "
          "\"first_token_kl_nats\": %.6g, \"first_token_agreement\": %.4f, "
          "\"greedy_agreement\": %.4f, \"greedy_common_prefix\": %.3f}",
          VariantName(kVariants[v]), t.bits / t.bytes, t.bits / t.tokens, t.kl / n,
          t.first_argmax_same / n, static_cast<double>(t.greedy_same) / t.greedy_total,
          t.greedy_prefix / n));
    }
    const std::string json = absl::StrFormat(
        "{\"windows\": %zu, \"prompt_tokens\": %lld, \"continuation_tokens\": %lld, "
        "\"greedy_tokens\": %lld, \"pruned_layers\": [%s], \"keep_every\": %d, "
        "\"protected_tokens\": %d,\n \"variants\": [\n  %s]}\n",
        windows.size(), static_cast<long long>(prompt_tokens),
        static_cast<long long>(continuation_tokens), static_cast<long long>(greedy_tokens),
        layers == "none" ? "" : layers, settings.keep_every, settings.protected_tokens,
        absl::StrJoin(rows, ",\n  "));
    std::fputs(json.c_str(), stdout);
    return absl::OkStatus();
  }
  std::printf(
      "%zu windows of %lld prompt + %lld continuation tokens from %s; pruned layers %s "
      "(0-based), keep_every %d, %d protected ids\n",
      windows.size(), static_cast<long long>(prompt_tokens),
      static_cast<long long>(continuation_tokens), path.c_str(), layers.c_str(),
      settings.keep_every, settings.protected_tokens);
  std::printf("%-22s %10s %10s %12s %12s %10s %12s\n", "prefill", "bits/byte", "delta",
              "first-KL", "first-same", absl::StrCat("greedy@", greedy_tokens).c_str(),
              "same-prefix");
  const double full_bpb = totals[0].bits / totals[0].bytes;
  for (size_t v = 0; v < kVariants.size(); ++v) {
    const Totals& t = totals[v];
    std::printf("%-22s %10.4f %+10.4f %12.3e %12.3f %10.3f %12.1f\n",
                std::string(VariantName(kVariants[v])).c_str(), t.bits / t.bytes,
                t.bits / t.bytes - full_bpb, t.kl / n, t.first_argmax_same / n,
                static_cast<double>(t.greedy_same) / t.greedy_total, t.greedy_prefix / n);
  }
  return absl::OkStatus();
}

}  // namespace tandem::tools
