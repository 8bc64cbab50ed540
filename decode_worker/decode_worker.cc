#include "decode_worker/decode_worker.h"

#include <utility>

namespace tandem::decode {

DecodeWorker::DecodeWorker(engine::EngineLoop& loop, store::StorePool& store,
                           metrics::Metrics& metrics)
    : loop_(loop), metrics_(metrics.ForRole("decode")) {
  metrics_.pruned_layers->Set(0);  // decode always runs the full model
  service_ = std::make_unique<DecodeService>(
      loop, store, DecodeServiceOptions{.on_transfer = [h = metrics_.kv_transfer_time](double s) {
        h->Observe(s);
      }});
}

void DecodeWorker::StartAgent(rpc::WorkerAgentOptions options) {
  options.registration.set_role(role());
  agent_ = std::make_unique<rpc::WorkerAgent>(loop_, *service_, metrics_, std::move(options));
}

}  // namespace tandem::decode
