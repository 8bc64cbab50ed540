#include "router/router_service.h"

#include <utility>

#include "common/kv/block_hash.h"
#include "common/rpc/status.h"
#include "common/security/authorizer.h"
#include "router/generate_call.h"

namespace tandem::router {

RouterService::RouterService(const RouterOptions& options, const tokenizer::Tokenizer* tokenizer,
                             metrics::Metrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      metrics_(metrics != nullptr ? metrics->ForRole("router", "grpc") : metrics::RoleMetrics{}),
      http_metrics_(metrics != nullptr ? metrics->ForRole("router", "http")
                                       : metrics::RoleMetrics{}),
      prefill_pool_("prefill", options.pool),
      decode_pool_("decode", options.pool),
      balancer_(options.balancer,
                metrics != nullptr ? &metrics->balancer(options.colocated) : nullptr),
      workload_(options.workload_window),
      pacer_(options.max_prefill_ahead_bytes),
      queue_({.max_queued_requests = options.max_queued_requests,
              .max_queued_tokens = options.max_queued_tokens},
             metrics_.requests_waiting, metrics_.requests_running),
      env_{
          .options = options_,
          .tokenizer = tokenizer_,
          .model_hash = kv::HashModelId(options_.model_id, options_.kv_layout.weight_quantization(),
                                        options_.kv_layout.weights_fingerprint()),
          .metrics = metrics_,
          .http_metrics = http_metrics_,
          .prefill_pool = prefill_pool_,
          .decode_pool = decode_pool_,
          .balancer = balancer_,
          .pacer = pacer_,
          .queue = queue_,
          .workload = workload_,
          .clock = options_.clock != nullptr ? *options_.clock : TimeSource::Steady(),
          .next_serial = next_serial_,
          .shutting_down = shutting_down_},
      watchdog_(options_.grpc_write_timeout) {}

RouterService::Load RouterService::GetLoad() const {
  const RequestQueue::Counts c = queue_.counts();
  return {c.waiting, c.waiting_tokens, c.running, pacer_.queued()};
}

void RouterService::PollPacing() {
  PrefillPacer::Runnable run;
  pacer_.Poll(env_.BalancerEngaged(), &run);
  for (auto& start : run) start();
}

namespace {

// The `authorization` metadata a client sent; empty without one.
std::string Authorization(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  std::shared_ptr<security::KeyLease> lease;
  if (options_.api_keys != nullptr) {
    absl::StatusOr<std::shared_ptr<security::KeyLease>> admitted =
        options_.api_keys->Admit(Authorization(*context), "/tandem.v1.Inference/Generate");
    if (!admitted.ok()) {
      return security::Refuse<grpc::ServerWriteReactor<grpc::ByteBuffer>>(
          rpc::ToGrpcStatus(admitted.status()));
    }
    lease = *std::move(admitted);
  }
  return new GenerateCall(env_, context, *request, std::move(lease), watchdog_);
}

grpc::ServerUnaryReactor* RouterService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const tandem::v1::GetModelInfoRequest*,
                                                      tandem::v1::ModelInfo* response) {
  if (options_.api_keys != nullptr) {
    absl::StatusOr<std::string> key = options_.api_keys->Authenticate(
        Authorization(*context), "/tandem.v1.Inference/GetModelInfo");
    if (!key.ok()) {
      grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
      reactor->Finish(rpc::ToGrpcStatus(key.status()));
      return reactor;
    }
  }
  response->set_name(options_.model_name);
  response->set_architecture(options_.architecture);
  response->set_context_length(static_cast<int32_t>(options_.limits.context_length));
  response->set_vocab_size(options_.limits.vocab_size);
  response->set_kv_dtype(options_.kv_dtype);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::router
