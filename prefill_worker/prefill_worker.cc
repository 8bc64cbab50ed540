#include "prefill_worker/prefill_worker.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"

namespace tandem::prefill {
namespace {

// Exports each attention-stability check (POP's runtime monitor) as
// tandem_pruning_attention_cosine{layer} and counts it; a check with a pruned layer below
// `alert_below` is logged and counted as an alert.
std::function<void(const std::vector<model::LayerSimilarity>&)> StabilityReporter(
    metrics::Metrics& metrics, const std::vector<uint8_t>& pruned, double alert_below) {
  std::vector<prometheus::Gauge*> cosine(pruned.size(), nullptr);
  for (size_t layer = 0; layer < pruned.size(); ++layer) {
    if (pruned[layer]) cosine[layer] = metrics.PruningCosine("prefill", static_cast<int>(layer));
  }
  return [cosine, m = metrics.ForRole("prefill"),
          alert_below](const std::vector<model::LayerSimilarity>& layers) {
    const model::LayerSimilarity* worst = nullptr;
    for (const model::LayerSimilarity& l : layers) {
      if (cosine[l.layer] != nullptr) cosine[l.layer]->Set(l.cosine);
      if (worst == nullptr || l.cosine < worst->cosine) worst = &l;
    }
    if (worst == nullptr || worst->cosine >= alert_below) {
      m.stability_checks->Increment();
      return;
    }
    m.stability_alerts->Increment();
    Log(LogLevel::kWarning, "prefill",
        absl::StrCat("pruning attention-stability alert: layer ", worst->layer,
                     " attention-output cosine ", worst->cosine, " < ", alert_below,
                     " (pruned vs full prefill of a sampled prompt); consider a later "
                     "kv_cache_optimization.pruning.start_layer"));
  };
}

}  // namespace

PrefillWorker::PrefillWorker(engine::EngineLoop& loop, store::StorePool& store,
                             metrics::Metrics& metrics, const PrefillWorkerOptions& options)
    : ServiceWorker(loop, metrics.ForRole("prefill")) {
  const auto& pruned = options.pruned_layers;
  metrics_.pruned_layers->Set(static_cast<double>(std::count(pruned.begin(), pruned.end(), 1)));
  PrefillServiceOptions service;
  service.on_transfer = [h = metrics_.kv_transfer_time](double s) { h->Observe(s); };
  service.authorizer = options.authorizer;
  service.reserve_ahead = options.reserve_ahead;
  service.load_prefixes = options.load_prefixes;
  if (options.load_prefixes) {
    service.on_prefix_lookup = [h = metrics.PrefixLookupTime("prefill")](double s) {
      h->Observe(s);
    };
  }
  if (!pruned.empty()) {
    service.stability_sample_rate = options.stability_sample_rate;
    service.on_stability = StabilityReporter(metrics, pruned, options.stability_alert_below);
  }
  service_ = std::make_unique<PrefillService>(loop, store, std::move(service));
}

}  // namespace tandem::prefill
