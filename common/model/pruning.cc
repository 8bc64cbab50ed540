#include "common/model/pruning.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem::model {

int StartLayerForRatio(double ratio, int num_layers) {
  const int pruned = static_cast<int>(std::lround(std::clamp(ratio, 0.0, 1.0) * num_layers));
  return num_layers - pruned;
}

absl::StatusOr<PruningSettings> ResolvePruningSettings(int start_layer, double ratio,
                                                       int keep_every, int protected_tokens,
                                                       int num_layers) {
  if (ratio > 0 && start_layer > 0) {
    return absl::InvalidArgumentError("give a pruning start layer or a pruning ratio, not both");
  }
  if (!(ratio >= 0 && ratio <= 1) || start_layer < 0 || keep_every < 0 || protected_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pruning ratio must be in [0, 1] and start layer, keep_every and protected tokens >= 0 "
        "(got ratio ", ratio, ", start layer ", start_layer, ", keep_every ", keep_every,
        ", protected tokens ", protected_tokens, ")"));
  }
  PruningSettings s{.start_layer = ratio > 0 ? StartLayerForRatio(ratio, num_layers) : start_layer,
                    .keep_every = keep_every,
                    .protected_tokens = protected_tokens};
  if (s.start_layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pruning start layer ", s.start_layer, " prunes nothing: the model's layers are 0..",
        num_layers - 1, " (0-based, as model.layers.N in the weights)",
        ratio > 0 ? absl::StrCat("; ratio ", ratio, " rounds to no layer") : ""));
  }
  return s;
}

std::vector<uint8_t> PrunedLayers(const PruningSettings& settings, int num_layers) {
  std::vector<uint8_t> pruned(std::max(num_layers, 0), 0);
  for (int layer = std::max(settings.start_layer, 0); layer < num_layers; ++layer) {
    const int index = layer - settings.start_layer;
    const bool kept = settings.keep_every > 0 && (index + 1) % settings.keep_every == 0;
    pruned[layer] = kept ? 0 : 1;
  }
  return pruned;
}

void MarkProtectedTokens(std::span<const int32_t> prompt, int n,
                         std::span<const int32_t> excluded, std::span<uint8_t> full_depth) {
  if (n <= 0) return;
  struct Count {
    int64_t count = 0;
    size_t first = 0;
  };
  absl::flat_hash_map<int32_t, Count> counts;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (std::find(excluded.begin(), excluded.end(), prompt[i]) != excluded.end()) continue;
    auto [it, inserted] = counts.try_emplace(prompt[i], Count{0, i});
    ++it->second.count;
  }
  std::vector<std::pair<int32_t, Count>> ranked(counts.begin(), counts.end());
  const size_t keep = std::min<size_t>(ranked.size(), static_cast<size_t>(n));
  std::partial_sort(ranked.begin(), ranked.begin() + keep, ranked.end(),
                    [](const auto& a, const auto& b) {
                      if (a.second.count != b.second.count) return a.second.count > b.second.count;
                      return a.second.first < b.second.first;
                    });
  absl::flat_hash_set<int32_t> chosen;
  for (size_t i = 0; i < keep; ++i) chosen.insert(ranked[i].first);
  for (size_t i = 0; i < prompt.size() && i < full_depth.size(); ++i) {
    if (chosen.contains(prompt[i])) full_depth[i] = 1;
  }
}

}  // namespace tandem::model
