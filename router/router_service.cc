#include "router/router_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/block_hash.h"
#include "router/generate_call.h"

namespace tandem::router {

RouterService::RouterService(const RouterOptions& options, const tokenizer::Tokenizer* tokenizer,
                             metrics::Metrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      metrics_(metrics != nullptr ? metrics->ForRole("router") : metrics::RoleMetrics{}),
      prefill_pool_("prefill", options.pool),
      decode_pool_("decode", options.pool),
      balancer_(options.balancer,
                metrics != nullptr ? &metrics->balancer(options.colocated) : nullptr),
      model_hash_(kv::HashModelId(options.model_id)) {}

RouterService::Load RouterService::GetLoad() const {
  absl::MutexLock lock(&mu_);
  return {waiting_, waiting_tokens_, running_, static_cast<int64_t>(paced_.size())};
}

absl::Status RouterService::Admit(int64_t tokens) {
  if (shutting_down_) return absl::UnavailableError("the router is shutting down");
  absl::MutexLock lock(&mu_);
  if (waiting_ >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrCat(
        waiting_, " requests are already waiting (router.max_queued_requests); retry later"));
  }
  if (waiting_tokens_ + tokens > options_.max_queued_tokens) {
    return absl::ResourceExhaustedError(absl::StrCat(waiting_tokens_,
                                                     " prompt tokens are already waiting; ", tokens,
                                                     " more would pass router.max_queued_tokens (",
                                                     options_.max_queued_tokens, "); retry later"));
  }
  ++waiting_;
  waiting_tokens_ += tokens;
  if (metrics_.requests_waiting != nullptr) metrics_.requests_waiting->Set(waiting_);
  return absl::OkStatus();
}

void RouterService::StartRunning(int64_t tokens) {
  absl::MutexLock lock(&mu_);
  --waiting_;
  waiting_tokens_ -= tokens;
  ++running_;
  if (metrics_.requests_waiting != nullptr) {
    metrics_.requests_waiting->Set(waiting_);
    metrics_.requests_running->Set(running_);
  }
}

void RouterService::Leave(bool running, int64_t tokens) {
  absl::MutexLock lock(&mu_);
  if (running) {
    --running_;
  } else {
    --waiting_;
    waiting_tokens_ -= tokens;
  }
  if (metrics_.requests_waiting != nullptr) {
    metrics_.requests_waiting->Set(waiting_);
    metrics_.requests_running->Set(running_);
  }
}

void RouterService::SchedulePrefill(std::shared_ptr<CallState> call, int64_t bytes,
                                    bool high_priority) {
  {
    absl::MutexLock lock(&mu_);
    const bool paced = !high_priority && balancer_.engaged(Clock::now()) && ahead_bytes_ > 0 &&
                       ahead_bytes_ + bytes > options_.max_prefill_ahead_bytes;
    if (paced) {
      paced_.push_back({std::move(call), bytes});
      return;
    }
    ahead_bytes_ += bytes;
  }
  call->RunPrefill(high_priority);
}

void RouterService::PrefillAdmitted(int64_t bytes) {
  std::vector<std::shared_ptr<CallState>> runnable;
  {
    absl::MutexLock lock(&mu_);
    ahead_bytes_ -= bytes;
    const bool engaged = balancer_.engaged(Clock::now());
    while (!paced_.empty() &&
           (!engaged || ahead_bytes_ == 0 ||
            ahead_bytes_ + paced_.front().bytes <= options_.max_prefill_ahead_bytes)) {
      ahead_bytes_ += paced_.front().bytes;
      runnable.push_back(std::move(paced_.front().call));
      paced_.pop_front();
    }
  }
  for (auto& call : runnable) call->RunPrefill(false);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new GenerateCall(*this, context, *request);
}

grpc::ServerUnaryReactor* RouterService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const tandem::v1::GetModelInfoRequest*,
                                                      tandem::v1::ModelInfo* response) {
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
