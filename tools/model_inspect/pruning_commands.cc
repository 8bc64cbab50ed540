// The prefill-only pruning (POP) diagnostics of model-inspect.
//  - prune-eval: what POP costs in quality, and what its two safeguards are worth. Each window
//    of a text is a prompt and its true continuation; the prompt is prefilled four ways (full,
//    POP, POP without boundary handling, POP without independent KV) and the continuation then
//    runs at full depth on the cache that prefill left, as a decode worker would run it.
//  - --kv-cache --pruning-stats: how far a pruned prefill's activations and cache drift from a
//    full one, layer by layer (the seed article's troubleshooting view), and the last token's
//    attention maps.
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
#include "common/config/config.h"
#include "common/model/model.h"
#include "common/model/pruning.h"
#include "common/model/pruning_check.h"
#include "common/model/scratch_kv.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "tools/model_inspect/commands.h"
#include "tools/model_inspect/png.h"
#include "tools/model_inspect/text_windows.h"

namespace tandem::tools {
namespace {

// How the prompt is prefilled.
enum class Variant {
  kFull,             // every layer for every token: the reference
  kPop,              // POP as Tandem runs it
  kNoBoundary,       // POP, but the last prompt token is pruned too (no boundary handling)
  kNoIndependentKv,  // POP, but pruned tokens leave their K/V in the pruned layers unwritten
};
constexpr std::array kVariants = {Variant::kFull, Variant::kPop, Variant::kNoBoundary,
                                  Variant::kNoIndependentKv};

std::string_view VariantName(Variant v) {
  switch (v) {
    case Variant::kFull:
      return "full";
    case Variant::kPop:
      return "pop";
    case Variant::kNoBoundary:
      return "pop-no-boundary";
    case Variant::kNoIndependentKv:
      return "pop-no-independent-kv";
  }
  return "?";
}

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
        pruned_layers_(model::PrunedLayers(settings, model.config().num_layers)),
        kv_(model, kv_dtype, max_positions) {}

  const std::vector<uint8_t>& pruned_layers() const { return pruned_layers_; }

  absl::StatusOr<WindowResult> Run(const Window& w, Variant variant, int greedy_tokens) {
    kv_.Clear();
    const int64_t vocab = model_.config().vocab_size;
    const int64_t p = static_cast<int64_t>(w.prompt.size());
    WindowResult r;

    // Prefill.
    std::vector<uint8_t> full_depth = model::PromptFullDepth(w.prompt, settings_, model_.config());
    if (variant == Variant::kNoBoundary) full_depth.back() = 0;
    if (variant == Variant::kNoIndependentKv) {
      // Each run of pruned positions, then its K/V in pruned layers cleared, then the next
      // full-depth position alone: every full-depth token attends to what such a cache holds
      // (zero: scores of 0, values of 0).
      int64_t run = 0;
      for (int64_t i = 0; i < p; ++i) {
        if (!full_depth[i]) continue;
        if (run < i) {
          const std::vector<uint8_t> pruned_rows(i - run, 0);
          const model::PruningPlan plan{pruned_layers_, pruned_rows};
          TANDEM_RETURN_IF_ERROR(
              kv_.Forward(&w.prompt[run], i - run, run, model::LogitsMode::kNone, &plan));
          kv_.Zero(pruned_layers_, run, i);
        }
        TANDEM_RETURN_IF_ERROR(
            kv_.Forward(&w.prompt[i], 1, i,
                        i == p - 1 ? model::LogitsMode::kLast : model::LogitsMode::kNone, nullptr));
        run = i + 1;
      }
    } else {
      const model::PruningPlan plan{pruned_layers_, full_depth};
      TANDEM_RETURN_IF_ERROR(kv_.Forward(w.prompt.data(), p, 0, model::LogitsMode::kLast,
                                         variant == Variant::kFull ? nullptr : &plan));
    }
    const std::vector<float> first(kv_.logits().begin(), kv_.logits().begin() + vocab);
    r.first_log_probs = LogSoftmax(first.data(), vocab);

    // The true continuation at full depth, one chunk (as exact as decoding it token by token).
    const auto& cont = w.continuation;
    r.continuation_bits = -r.first_log_probs[cont[0]];
    if (cont.size() > 1) {
      TANDEM_RETURN_IF_ERROR(kv_.Forward(cont.data(), static_cast<int64_t>(cont.size()) - 1, p,
                                         model::LogitsMode::kAll, nullptr));
      for (size_t i = 0; i + 1 < cont.size(); ++i) {
        r.continuation_bits -= LogSoftmax(kv_.logits().data() + i * vocab, vocab)[cont[i + 1]];
      }
    }
    r.continuation_bits /= std::log(2.0);

    // Greedy decode from the prefilled cache (it overwrites the continuation's positions in
    // order, and attention never reads past the position being written).
    int32_t token = Argmax(first.data(), vocab);
    r.greedy.push_back(token);
    for (int g = 1; g < greedy_tokens; ++g) {
      TANDEM_RETURN_IF_ERROR(kv_.Forward(&token, 1, p + g - 1, model::LogitsMode::kLast, nullptr));
      token = Argmax(kv_.logits().data(), vocab);
      r.greedy.push_back(token);
    }
    return r;
  }

 private:
  model::Model& model_;
  const model::PruningSettings settings_;
  const std::vector<uint8_t> pruned_layers_;
  model::ScratchKv kv_;
};

// The attention probabilities of `query` (one layer's q_width floats) over cache positions
// 0..n-1, head-major: [heads][n]. Sliding-window models see only the window.
std::vector<double> AttentionMap(const model::ScratchKv& kv, const model::ModelConfig& c, int layer,
                                 const std::vector<float>& query, int64_t n) {
  const int hd = c.head_dim, group = c.num_heads / c.num_kv_heads;
  const int64_t first = c.sliding_window > 0 ? std::max<int64_t>(0, n - c.sliding_window) : 0;
  std::vector<double> probs(static_cast<size_t>(c.num_heads) * n, 0.0);
  std::vector<float> key(hd);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int head = 0; head < c.num_heads; ++head) {
    double* row = probs.data() + head * n;
    double max = -INFINITY;
    for (int64_t pos = first; pos < n; ++pos) {
      kv.Read(layer, /*value=*/false, head / group, pos, key.data());
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += static_cast<double>(query[head * hd + d]) * key[d];
      row[pos] = dot * scale;
      max = std::max(max, row[pos]);
    }
    double sum = 0;
    for (int64_t pos = first; pos < n; ++pos) sum += (row[pos] = std::exp(row[pos] - max));
    for (int64_t pos = first; pos < n; ++pos) row[pos] /= sum;
  }
  return probs;
}

// One row of pixels per (layer, head), `row_height` tall; the full map on the left, the
// pruned one on the right; a red strip marks the rows of pruned layers. Colour: log10 of the
// probability from -4 (and below) to 0.
absl::Status WriteAttentionPng(const std::string& path, const model::ModelConfig& c,
                               const std::vector<std::vector<double>>& full,
                               const std::vector<std::vector<double>>& pruned,
                               const std::vector<uint8_t>& pruned_layers, int64_t n) {
  constexpr int kStrip = 6, kGap = 8, kRowHeight = 4;
  const int64_t width = kStrip + n + kGap + n;
  const int64_t rows = static_cast<int64_t>(c.num_layers) * c.num_heads;
  if (width > 20000 || rows * kRowHeight > 20000) {
    return absl::InvalidArgumentError("attention map too large for a PNG (over 20000 pixels)");
  }
  const int64_t height = rows * kRowHeight;
  std::vector<uint8_t> rgb(static_cast<size_t>(width * height) * 3, 255);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    for (int head = 0; head < c.num_heads; ++head) {
      for (int dy = 0; dy < kRowHeight; ++dy) {
        uint8_t* line = rgb.data() + ((layer * c.num_heads + head) * kRowHeight + dy) * width * 3;
        if (pruned_layers[layer]) {
          for (int x = 0; x < kStrip - 1; ++x) line[3 * x + 1] = line[3 * x + 2] = 0;
        }
        for (int panel = 0; panel < 2; ++panel) {
          const auto& maps = panel == 0 ? full : pruned;
          const int64_t x0 = kStrip + panel * (n + kGap);
          for (int64_t pos = 0; pos < n; ++pos) {
            const double p = maps[layer].empty() ? 0.0 : maps[layer][head * n + pos];
            HeatColor((std::log10(std::max(p, 1e-12)) + 4) / 4, line + 3 * (x0 + pos));
          }
        }
      }
    }
  }
  return WritePng(path, static_cast<int>(width), static_cast<int>(height), rgb);
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
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags(
      {"model", "text-file", "prompt-tokens", "continuation-tokens", "greedy-tokens", "windows",
       "json", "kv-dtype", "threads", "weight-memory", "cpu-gemm", "prune-start-layer",
       "prune-ratio", "prune-keep-every", "protect-tokens"})));
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("text-file"));
  TANDEM_ASSIGN_OR_RETURN(WindowFlags flags, ParseWindowFlags(args, 512, 128));
  const int64_t prompt_tokens = flags.prompt_tokens;
  const int64_t continuation_tokens = flags.continuation_tokens;
  const int64_t max_windows = flags.windows;
  TANDEM_ASSIGN_OR_RETURN(int64_t greedy_tokens, args.IntOr("greedy-tokens", 32));
  if (greedy_tokens < 1 || greedy_tokens > kMaxWindowTokens) {
    return absl::InvalidArgumentError("--greedy-tokens must be >= 1");
  }
  TANDEM_ASSIGN_OR_RETURN(TextEvalInputs in, LoadTextEval(args, path));
  const std::string& text = in.text;
  auto& tok = in.tokenizer;
  auto& model = in.model;
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
      CutWindows(*tok, text, static_cast<int>(prompt_tokens), static_cast<int>(continuation_tokens),
                 static_cast<int>(max_windows)));

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
          VariantName(kVariants[v]), t.bits / std::max<int64_t>(t.bytes, 1), t.bits / t.tokens,
          t.kl / n, t.first_argmax_same / n, static_cast<double>(t.greedy_same) / t.greedy_total,
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
  std::printf("%-22s %10s %10s %12s %12s %10s %12s\n", "prefill", "bits/byte", "delta", "first-KL",
              "first-same", absl::StrCat("greedy@", greedy_tokens).c_str(), "same-prefix");
  const double full_bpb = totals[0].bits / std::max<int64_t>(totals[0].bytes, 1);
  for (size_t v = 0; v < kVariants.size(); ++v) {
    const Totals& t = totals[v];
    std::printf(
        "%-22s %10.4f %+10.4f %12.3e %12.3f %10.3f %12.1f\n",
        std::string(VariantName(kVariants[v])).c_str(), t.bits / std::max<int64_t>(t.bytes, 1),
        t.bits / std::max<int64_t>(t.bytes, 1) - full_bpb, t.kl / n, t.first_argmax_same / n,
        static_cast<double>(t.greedy_same) / t.greedy_total, t.greedy_prefix / n);
  }
  return absl::OkStatus();
}

absl::Status RunPruningStats(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags(
      {"model", "kv-cache", "pruning-stats", "config", "prompt-file", "kv-dtype", "threads",
       "weight-memory", "cpu-gemm", "attention-csv", "attention-png"})));
  TANDEM_ASSIGN_OR_RETURN(std::string config_path, args.String("config"));
  TANDEM_ASSIGN_OR_RETURN(config::TandemConfig config, config::LoadConfigFile(config_path));
  TANDEM_ASSIGN_OR_RETURN(std::string prompt_path, args.String("prompt-file"));
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(prompt_path));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::Load(dir));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                          tok->Encode(text, /*add_special_tokens=*/true));
  if (prompt.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(prompt_path, ": the prompt needs at least 2 tokens, it has ", prompt.size()));
  }
  TANDEM_ASSIGN_OR_RETURN(auto pool, MakePool(args));
  TANDEM_ASSIGN_OR_RETURN(auto model, LoadModel(args, *pool));
  const auto& c = model->config();
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(prompt_path, ": ", n,
                                                   " tokens exceed the "
                                                   "model's context of ",
                                                   c.max_position_embeddings));
  }
  const auto& pop = config.kv_cache_optimization;
  auto resolved = model::ResolvePruningSettings(pop.pruning_start_layer, pop.pruning_ratio,
                                                pop.pruning_keep_every,
                                                pop.protection_high_frequency_tokens, c.num_layers);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_path, ": kv_cache_optimization: ", resolved.status().message()));
  }
  const model::PruningSettings settings = *resolved;
  const std::vector<uint8_t> pruned_layers = model::PrunedLayers(settings, c.num_layers);
  const std::vector<uint8_t> full_depth = model::PromptFullDepth(prompt, settings, c);
  TANDEM_ASSIGN_OR_RETURN(DType kv_dtype, KvDType(args, c));

  // The same prompt prefilled twice: every layer, and pruned as the config says.
  model::ScratchKv full_kv(*model, kv_dtype, n), pruned_kv(*model, kv_dtype, n);
  model::ForwardProbe full, pruned;
  full.record = pruned.record = model::ForwardProbe::Record::kAllRows;
  TANDEM_RETURN_IF_ERROR(
      full_kv.Forward(prompt.data(), n, 0, model::LogitsMode::kLast, nullptr, &full));
  const model::PruningPlan plan{pruned_layers, full_depth};
  TANDEM_RETURN_IF_ERROR(
      pruned_kv.Forward(prompt.data(), n, 0, model::LogitsMode::kLast, &plan, &pruned));

  int64_t full_count = 0;
  for (uint8_t f : full_depth) full_count += f;
  const double prune_ratio = static_cast<double>(n - full_count) / n;
  std::printf(
      "%s: %lld prompt tokens; %s: layers %s pruned (0-based: start_layer %d, keep_every %d), "
      "%lld of them at full depth (the last and the positions of %d protected ids)%s\n",
      prompt_path.c_str(), static_cast<long long>(n), config_path.c_str(),
      LayerList(pruned_layers).c_str(), settings.start_layer, settings.keep_every,
      static_cast<long long>(full_count), settings.protected_tokens,
      pop.enabled ? "" : "; note: kv_cache_optimization.enabled is false in the config");
  const int64_t h = c.hidden_size;
  const int hd = c.head_dim;
  std::vector<float> a(hd), b(hd);
  int low = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (!pruned_layers[layer]) continue;
    // Means over the pruned positions (the ones whose state and K/V differ by construction).
    double hidden = 0, k = 0, v = 0;
    for (int64_t pos = 0; pos < n; ++pos) {
      if (full_depth[pos]) continue;
      hidden += model::CosineSimilarity(full.hidden[layer].data() + pos * h,
                                        pruned.hidden[layer].data() + pos * h, h);
      for (int head = 0; head < c.num_kv_heads; ++head) {
        full_kv.Read(layer, false, head, pos, a.data());
        pruned_kv.Read(layer, false, head, pos, b.data());
        k += model::CosineSimilarity(a.data(), b.data(), hd) / c.num_kv_heads;
        full_kv.Read(layer, true, head, pos, a.data());
        pruned_kv.Read(layer, true, head, pos, b.data());
        v += model::CosineSimilarity(a.data(), b.data(), hd) / c.num_kv_heads;
      }
    }
    const double pruned_count = std::max<double>(1, n - full_count);
    const double similarity =
        model::CosineSimilarity(full.attention[layer].data() + (n - 1) * h,
                                pruned.attention[layer].data() + (n - 1) * h, h);
    low += similarity < 0.9;
    std::printf("Layer %d: prune_ratio=%.2f, similarity=%.2f (hidden %.2f, K %.2f, V %.2f)%s\n",
                layer, prune_ratio, similarity, hidden / pruned_count, k / pruned_count,
                v / pruned_count,
                similarity < 0.9 ? "  LOW: attention output similarity below 0.9" : "");
  }
  const int64_t vocab = c.vocab_size;
  const std::vector<double> lp_full = LogSoftmax(full_kv.logits().data(), vocab);
  const std::vector<double> lp_pruned = LogSoftmax(pruned_kv.logits().data(), vocab);
  const int32_t top_full = Argmax(full_kv.logits().data(), vocab);
  const int32_t top_pruned = Argmax(pruned_kv.logits().data(), vocab);
  std::printf("first token: KL(full || pruned) = %.4g nats; greedy %d (full) vs %d (pruned)%s\n",
              KlDivergence(lp_full, lp_pruned), top_full, top_pruned,
              top_full == top_pruned ? "" : "  DIFFERENT");
  if (low > 0) {
    std::printf(
        "%d pruned layer(s) below 0.9: prune fewer layers (a later start_layer), keep "
        "every k-th (keep_every) or protect more tokens\n",
        low);
  }

  // The last token's attention maps, every layer and head, full and pruned.
  if (!args.Has("attention-csv") && !args.Has("attention-png")) return absl::OkStatus();
  std::vector<std::vector<double>> full_maps(c.num_layers), pruned_maps(c.num_layers);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    full_maps[layer] = AttentionMap(full_kv, c, layer, full.last_query[layer], n);
    if (!pruned.last_query[layer].empty()) {
      pruned_maps[layer] = AttentionMap(pruned_kv, c, layer, pruned.last_query[layer], n);
    }
  }
  if (args.Has("attention-csv")) {
    TANDEM_ASSIGN_OR_RETURN(std::string csv_path, args.String("attention-csv"));
    std::string csv = "layer,head,position,full,pruned\n";
    for (int layer = 0; layer < c.num_layers; ++layer) {
      for (int head = 0; head < c.num_heads; ++head) {
        for (int64_t pos = 0; pos < n; ++pos) {
          absl::StrAppendFormat(
              &csv, "%d,%d,%lld,%.6g,%.6g\n", layer, head, static_cast<long long>(pos),
              full_maps[layer][head * n + pos],
              pruned_maps[layer].empty() ? 0.0 : pruned_maps[layer][head * n + pos]);
        }
      }
    }
    TANDEM_RETURN_IF_ERROR(WriteStringToFile(csv_path, csv));
    std::printf("attention maps (CSV): %s\n", csv_path.c_str());
  }
  if (args.Has("attention-png")) {
    TANDEM_ASSIGN_OR_RETURN(std::string png_path, args.String("attention-png"));
    TANDEM_RETURN_IF_ERROR(
        WriteAttentionPng(png_path, c, full_maps, pruned_maps, pruned_layers, n));
    std::printf("attention maps (PNG, full left, pruned right, log10 p from -4 to 0): %s\n",
                png_path.c_str());
  }
  return absl::OkStatus();
}

absl::Status RunImportance(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(model::WithQuantizationFlags(
      {"model", "prompt-file", "prompt-tokens", "continuation-tokens", "windows", "epsilon",
       "budget", "kv-dtype", "threads", "weight-memory", "cpu-gemm"})));
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("prompt-file"));
  TANDEM_ASSIGN_OR_RETURN(WindowFlags flags, ParseWindowFlags(args, 256, 64));
  const int64_t prompt_tokens = flags.prompt_tokens;
  const int64_t continuation_tokens = flags.continuation_tokens;
  const int64_t max_windows = flags.windows;
  TANDEM_ASSIGN_OR_RETURN(double epsilon, args.DoubleOr("epsilon", 0.05));
  TANDEM_ASSIGN_OR_RETURN(double budget, args.DoubleOr("budget", 0.1));
  if (!(epsilon > 0 && epsilon <= 0.5) || !(budget >= 0 && budget < 1)) {
    return absl::InvalidArgumentError("--epsilon must be in (0, 0.5] and --budget in [0, 1)");
  }
  TANDEM_ASSIGN_OR_RETURN(TextEvalInputs in, LoadTextEval(args, path));
  const std::string& text = in.text;
  auto& tok = in.tokenizer;
  auto& model = in.model;
  const auto& c = model->config();
  if (prompt_tokens + continuation_tokens > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-tokens plus --continuation-tokens must fit the model's context (",
                     c.max_position_embeddings, ")"));
  }
  TANDEM_ASSIGN_OR_RETURN(DType kv_dtype, KvDType(args, c));
  TANDEM_ASSIGN_OR_RETURN(
      std::vector<Window> windows,
      CutWindows(*tok, text, static_cast<int>(prompt_tokens), static_cast<int>(continuation_tokens),
                 static_cast<int>(max_windows)));

  // Prefill is prompt tokens 0..P-2; decode is the last prompt token (POP's boundary) and the
  // continuation, teacher-forced. The loss is the decode tokens' mean cross-entropy (nats).
  const int layers = c.num_layers;
  const int64_t vocab = c.vocab_size;
  model::ScratchKv kv(*model, kv_dtype, prompt_tokens + continuation_tokens);
  model::ForwardProbe prefill_gates, decode_gates;
  auto prefill = [&](const Window& w) {
    return kv.Forward(w.prompt.data(), static_cast<int64_t>(w.prompt.size()) - 1, 0,
                      model::LogitsMode::kNone, nullptr, &prefill_gates);
  };
  std::vector<int32_t> decode_tokens;
  auto decode_loss = [&](const Window& w) -> absl::StatusOr<double> {
    const int64_t p = static_cast<int64_t>(w.prompt.size());
    decode_tokens.assign(1, w.prompt.back());
    decode_tokens.insert(decode_tokens.end(), w.continuation.begin(), w.continuation.end() - 1);
    TANDEM_RETURN_IF_ERROR(kv.Forward(decode_tokens.data(),
                                      static_cast<int64_t>(decode_tokens.size()), p - 1,
                                      model::LogitsMode::kAll, nullptr, &decode_gates));
    double loss = 0;
    for (size_t i = 0; i < w.continuation.size(); ++i) {
      loss -= LogSoftmax(kv.logits().data() + i * vocab, vocab)[w.continuation[i]];
    }
    return loss / static_cast<double>(w.continuation.size());
  };
  auto reset = [&](model::ForwardProbe& probe) { probe.residual_gates.assign(layers, 1.0f); };

  // importance[stage][layer]: the mean over windows of (dL/dg)^2, central differences.
  std::vector<double> importance[2] = {std::vector<double>(layers, 0.0),
                                       std::vector<double>(layers, 0.0)};
  double base_loss = 0;
  for (const Window& w : windows) {
    reset(prefill_gates);
    reset(decode_gates);
    TANDEM_RETURN_IF_ERROR(prefill(w));
    TANDEM_ASSIGN_OR_RETURN(double base, decode_loss(w));
    base_loss += base;
    // Decode-stage gates first: they reuse the ungated prompt cache.
    for (int layer = 0; layer < layers; ++layer) {
      double at[2];
      for (int side = 0; side < 2; ++side) {
        decode_gates.residual_gates[layer] = static_cast<float>(1 + (side ? -epsilon : epsilon));
        TANDEM_ASSIGN_OR_RETURN(at[side], decode_loss(w));
      }
      decode_gates.residual_gates[layer] = 1.0f;
      importance[1][layer] += std::pow((at[0] - at[1]) / (2 * epsilon), 2);
    }
    for (int layer = 0; layer < layers; ++layer) {
      double at[2];
      for (int side = 0; side < 2; ++side) {
        prefill_gates.residual_gates[layer] = static_cast<float>(1 + (side ? -epsilon : epsilon));
        TANDEM_RETURN_IF_ERROR(prefill(w));
        TANDEM_ASSIGN_OR_RETURN(at[side], decode_loss(w));
      }
      prefill_gates.residual_gates[layer] = 1.0f;
      importance[0][layer] += std::pow((at[0] - at[1]) / (2 * epsilon), 2);
    }
  }
  const double nw = static_cast<double>(windows.size());
  double total[2] = {0, 0};
  for (int stage = 0; stage < 2; ++stage) {
    for (double& v : importance[stage]) total[stage] += (v /= nw);
  }
  std::printf(
      "%zu windows of %lld prompt + %lld continuation tokens from %s; loss %.4f nats/token; "
      "gates 1 +- %g\n",
      windows.size(), static_cast<long long>(prompt_tokens),
      static_cast<long long>(continuation_tokens), path.c_str(), base_loss / nw, epsilon);
  std::printf("%5s %14s %9s %14s %9s %14s\n", "layer", "prefill", "share", "decode", "share",
              "prefill/decode");
  for (int layer = 0; layer < layers; ++layer) {
    const double p = importance[0][layer], d = importance[1][layer];
    std::printf("%5d %14.4e %8.1f%% %14.4e %8.1f%% %14.3f\n", layer, p,
                100 * p / std::max(total[0], 1e-300), d, 100 * d / std::max(total[1], 1e-300),
                d > 0 ? p / d : 0.0);
  }
  // The longest run of last layers whose prefill importance stays within the budget.
  int start = layers;
  double prefill_share = 0, decode_share = 0;
  while (start > 1) {
    const double next = prefill_share + importance[0][start - 1] / std::max(total[0], 1e-300);
    if (next > budget) break;
    prefill_share = next;
    decode_share += importance[1][start - 1] / std::max(total[1], 1e-300);
    --start;
  }
  if (start == layers) {
    std::printf(
        "recommendation: no layer range; the last layer alone carries %.1f%% of the "
        "prefill importance (budget %.0f%%, --budget)\n",
        100 * importance[0][layers - 1] / std::max(total[0], 1e-300), 100 * budget);
  } else {
    std::printf(
        "recommendation: prune layers %d..%d (kv_cache_optimization.pruning.start_layer "
        "%d, 0-based): %.1f%% of the prefill importance (budget %.0f%%, --budget), %.1f%% "
        "of the decode importance\n",
        start, layers - 1, start, 100 * prefill_share, 100 * budget, 100 * decode_share);
  }
  return absl::OkStatus();
}

}  // namespace tandem::tools
