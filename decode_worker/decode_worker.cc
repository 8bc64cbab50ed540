#include "decode_worker/decode_worker.h"

#include <utility>

namespace tandem::decode {

DecodeWorker::DecodeWorker(engine::EngineLoop& loop, store::StorePool& store,
                           metrics::Metrics& metrics, const security::Authorizer& authorizer,
                           int stream_interval)
    : ServiceWorker(loop, metrics.ForRole("decode")) {
  metrics_.pruned_layers->Set(0);  // decode always runs the full model
  service_ = std::make_unique<DecodeService>(
      loop, store,
      DecodeServiceOptions{
          .stream_interval = stream_interval,
          .on_transfer = [h = metrics_.kv_transfer_time](double s) { h->Observe(s); },
          .time_to_first_token = metrics_.time_to_first_token,
          .inter_token_latency = metrics_.inter_token_latency,
          .authorizer = &authorizer});
}

}  // namespace tandem::decode
