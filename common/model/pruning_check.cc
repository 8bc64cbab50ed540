#include "common/model/pruning_check.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/model/scratch_kv.h"
#include "common/util/status_macros.h"

namespace tandem::model {

double CosineSimilarity(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  if (aa == 0 && bb == 0) return 1.0;
  if (aa == 0 || bb == 0) return 0.0;
  return ab / std::sqrt(aa * bb);
}

std::vector<uint8_t> PromptFullDepth(std::span<const int32_t> prompt,
                                     const PruningSettings& settings, const ModelConfig& config) {
  std::vector<uint8_t> full_depth(prompt.size(), 0);
  if (!full_depth.empty()) full_depth.back() = 1;
  std::vector<int32_t> special = config.eos_token_ids;
  if (config.bos_token_id >= 0) special.push_back(config.bos_token_id);
  MarkProtectedTokens(prompt, settings.protected_tokens, special, full_depth);
  return full_depth;
}

absl::StatusOr<std::vector<LayerSimilarity>> CheckAttentionStability(
    Model& model, std::span<const int32_t> prompt, const PruningSettings& settings, DType kv_dtype,
    int chunk_size, const ChunkRunner& run_chunk) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n == 0) return absl::InvalidArgumentError("attention-stability check of an empty prompt");
  if (chunk_size <= 0) return absl::InvalidArgumentError("chunk_size must be positive");
  const ModelConfig& c = model.config();
  const std::vector<uint8_t> pruned_layers = PrunedLayers(settings, c.num_layers);
  const std::vector<uint8_t> full_depth = PromptFullDepth(prompt, settings, c);
  ForwardProbe full, pruned;
  full.record = pruned.record = ForwardProbe::Record::kLastRow;
  ScratchKv kv(model, kv_dtype, n);
  // One prefill in chunks; the probe watches the chunk holding the last token.
  auto prefill = [&](bool prune, ForwardProbe& probe) -> absl::Status {
    kv.Clear();
    for (int64_t start = 0; start < n; start += chunk_size) {
      const int64_t len = std::min<int64_t>(chunk_size, n - start);
      const PruningPlan plan{pruned_layers, std::span(full_depth).subspan(start, len)};
      auto forward = [&] {
        return kv.Forward(prompt.data() + start, len, start, LogitsMode::kNone,
                          prune ? &plan : nullptr, start + len == n ? &probe : nullptr);
      };
      TANDEM_RETURN_IF_ERROR(run_chunk ? run_chunk(forward) : forward());
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(prefill(false, full));
  TANDEM_RETURN_IF_ERROR(prefill(true, pruned));
  std::vector<LayerSimilarity> out;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    if (!pruned_layers[layer]) continue;
    out.push_back({layer, CosineSimilarity(full.attention[layer].data(),
                                           pruned.attention[layer].data(), c.hidden_size)});
  }
  return out;
}

}  // namespace tandem::model
