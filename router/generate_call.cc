#include "router/generate_call.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/kv/block_hash.h"
#include "common/rpc/status.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"
#include "router/request_validation.h"

namespace tandem::router {
namespace {

using tandem::v1::FinishReason;
using tandem::v1::GenerateResponse;

constexpr size_t kMaxCacheSaltBytes = 256;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Failures of the worker rather than of the request: another worker may succeed.
bool IsWorkerFailure(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:  // a worker shutting down cancels its calls
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
      return true;
    default:
      return false;
  }
}

grpc::Status WithContext(const std::string& what, const grpc::Status& status) {
  return grpc::Status(status.error_code(), absl::StrCat(what, ": ", status.error_message()));
}

void Observe(prometheus::Histogram* h, double v) {
  if (h != nullptr) h->Observe(v);
}
void Add(prometheus::Counter* c, double v) {
  if (c != nullptr) c->Increment(v);
}

}  // namespace

// Reads one Decode stream into its CallState; deletes itself when the call is done.
class DecodeReader final : public grpc::ClientReadReactor<tandem::v1::DecodeResponse> {
 public:
  DecodeReader(std::shared_ptr<CallState> call, Worker* worker, int64_t charged,
               std::shared_ptr<grpc::ClientContext> context, tandem::v1::DecodeRequest request)
      : call_(std::move(call)),
        worker_(worker),
        charged_(charged),
        context_(std::move(context)),
        request_(std::move(request)) {
    worker_->decode->async()->Decode(context_.get(), &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (call_->OnDecodeMessage(message_)) {
      StartRead(&message_);
    } else {
      context_->TryCancel();
    }
  }

  void OnDone(const grpc::Status& status) override {
    call_->OnDecodeDone(worker_, charged_, status);
    delete this;
  }

 private:
  std::shared_ptr<CallState> call_;
  Worker* const worker_;
  const int64_t charged_;  // the tokens the decode pool counted, for End
  std::shared_ptr<grpc::ClientContext> context_;
  tandem::v1::DecodeRequest request_;
  tandem::v1::DecodeResponse message_;
};

// Holds mu_; on release runs the work deferred while it was held.
class ABSL_SCOPED_LOCKABLE CallState::Lock {
 public:
  explicit Lock(CallState* s) ABSL_EXCLUSIVE_LOCK_FUNCTION(s->mu_) : s_(s) { s_->mu_.Lock(); }
  ~Lock() ABSL_UNLOCK_FUNCTION() {
    std::vector<std::function<void()>> work = std::move(s_->deferred_);
    s_->deferred_.clear();
    s_->mu_.Unlock();
    for (auto& w : work) w();
  }

 private:
  CallState* const s_;
};

struct CallState::Attempt {
  grpc::ClientContext context;
  tandem::v1::PrefillRequest request;
  tandem::v1::PrefillResponse response;
  Clock::time_point start = Clock::now();
  int64_t charged = 0;  // the tokens of work the pool counted (WorkerPool::Begin)
};

absl::StatusOr<AdmittedRequest> AdmitRequest(const CallEnvironment& env,
                                             tandem::v1::GenerateRequest request,
                                             Clock::time_point arrival, Door door,
                                             const std::string& key_name) {
  AdmittedRequest admitted;
  admitted.arrival = arrival;
  admitted.door = door;
  TANDEM_RETURN_IF_ERROR(ValidateSampling(request.sampling(), env.options.limits));
  TANDEM_ASSIGN_OR_RETURN(admitted.prompt,
                          PromptTokens(request, env.tokenizer, env.options.limits));
  if (request.cache_salt().size() > kMaxCacheSaltBytes) {
    return InvalidField("cache_salt", absl::StrCat("cache_salt is ", request.cache_salt().size(),
                                                   " bytes; at most ", kMaxCacheSaltBytes));
  }
  const std::string tenant = env.options.cache_salt_per_key && !key_name.empty()
                                 ? absl::StrCat("key:", key_name)
                                 : std::string();
  if (!tenant.empty() || !request.cache_salt().empty()) {
    admitted.cache_salt = kv::CacheSaltOf(absl::StrCat(tenant, "\x1f", request.cache_salt()));
  }
  if (env.shutting_down) return absl::UnavailableError("the router is shutting down");
  TANDEM_RETURN_IF_ERROR(env.queue.Admit(static_cast<int64_t>(admitted.prompt.size())));
  const uint64_t serial = env.next_serial.fetch_add(1);
  admitted.id = request.request_id().empty() ? absl::StrCat("req-", serial) : request.request_id();
  admitted.hashes = kv::HashPrefixBlocks(env.model_hash, admitted.prompt, env.options.block_size,
                                         admitted.cache_salt);
  admitted.sampling = std::move(*request.mutable_sampling());
  return admitted;
}

absl::StatusOr<std::shared_ptr<CallState>> StartCall(const CallEnvironment& env,
                                                     tandem::v1::GenerateRequest request,
                                                     std::shared_ptr<ResponseSink> sink,
                                                     std::chrono::system_clock::time_point deadline,
                                                     Clock::time_point arrival, Door door,
                                                     std::shared_ptr<security::KeyLease> lease) {
  TANDEM_ASSIGN_OR_RETURN(
      AdmittedRequest admitted,
      AdmitRequest(env, std::move(request), arrival, door, lease ? lease->name() : std::string()));
  admitted.lease = std::move(lease);
  deadline = std::min(deadline, std::chrono::system_clock::now() +
                                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                        env.options.default_deadline));
  auto state = std::make_shared<CallState>(env, std::move(sink), deadline, std::move(admitted));
  state->Start();
  return state;
}

CallState::CallState(const CallEnvironment& env, std::shared_ptr<ResponseSink> sink,
                     std::chrono::system_clock::time_point deadline, AdmittedRequest request)
    : env_(env),
      metrics_(env.MetricsOf(request.door)),
      sink_(std::move(sink)),
      deadline_(deadline),
      arrival_(request.arrival),
      key_(env.next_serial.fetch_add(1)),
      id_(std::move(request.id)),
      prompt_(std::move(request.prompt)),
      hashes_(std::move(request.hashes)),
      cache_salt_(request.cache_salt),
      sampling_(std::move(request.sampling)),
      lease_(std::move(request.lease)),
      tokens_(request.arrival) {}

void CallState::Start() {
  {
    Lock lock(this);
    output_.emplace(env_.tokenizer,
                    std::vector<std::string>(sampling_.stop().begin(), sampling_.stop().end()));
    prompt_logprobs_due_ = sampling_.prompt_logprobs();
  }
  Add(metrics_.prompt_tokens, static_cast<double>(prompt_.size()));
  env_.workload.RecordArrival(static_cast<int64_t>(prompt_.size()), env_.clock.Now());
  SchedulePrefill(static_cast<int64_t>(hashes_.size()) * env_.options.kv_bytes_per_block,
                  /*high_priority=*/false);
}

void CallState::SchedulePrefill(int64_t bytes, bool high_priority) {
  PrefillPacer::Runnable run;
  auto self = shared_from_this();
  env_.pacer.Schedule(
      key_, bytes, high_priority, env_.BalancerEngaged(),
      [self, high_priority] { self->RunPrefill(high_priority); }, &run);
  bool ended = false;
  {
    Lock lock(this);
    ended = phase_ == Phase::kDone;
  }
  // The call ended (cancelled, say) while it was being scheduled, and its release may have come
  // first: release again so the entry cannot outlive it.
  if (ended) ReleasePacing();
  for (auto& start : run) start();
}

void CallState::ReleasePacing() {
  PrefillPacer::Runnable run;
  env_.pacer.Release(key_, env_.BalancerEngaged(), &run);
  for (auto& start : run) start();
}

std::unique_ptr<grpc::ClientContext> CallState::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(deadline_);
  return context;
}

std::vector<int32_t> CallState::AllTokens() const {
  std::vector<int32_t> all = prompt_;
  all.insert(all.end(), generated_.begin(), generated_.end());
  return all;
}

bool CallState::IsEos(int32_t token) const {
  const auto& eos = env_.options.eos_token_ids;
  return std::find(eos.begin(), eos.end(), token) != eos.end();
}

void CallState::RunPrefill(bool high_priority) {
  if (env_.options.colocated) {
    {
      Lock lock(this);
      if (phase_ == Phase::kDone) return;
      if (!tokens_.first_token_at().has_value()) queue_seconds_ = Seconds(Clock::now() - arrival_);
      ++attempts_;
    }
    tandem::v1::KvHandle kv;  // the decode engine prefills the prompt itself
    kv.set_cache_salt(cache_salt_);
    StartDecode(kv);
    return;
  }
  auto attempt = std::make_shared<Attempt>();
  Worker* worker = nullptr;
  {
    Lock lock(this);
    if (phase_ == Phase::kDone) return;
    worker = env_.prefill_pool.PickPrefill(hashes_, failed_prefill_);
    if (worker == nullptr) {
      Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no prefill worker is available"));
      return;
    }
    if (!tokens_.first_token_at().has_value()) queue_seconds_ = Seconds(Clock::now() - arrival_);
    phase_ = Phase::kPrefill;
    ++attempts_;
    attempt->context.set_deadline(deadline_);
    attempt->request.set_request_id(id_);
    for (int32_t t : AllTokens()) attempt->request.add_token_ids(t);
    attempt->request.set_completion_tokens(static_cast<int>(generated_.size()));
    *attempt->request.mutable_sampling() = sampling_;
    attempt->request.set_high_priority(high_priority);
    attempt->request.set_cache_salt(cache_salt_);
    call_ = std::shared_ptr<grpc::ClientContext>(attempt, &attempt->context);
    attempt->charged = env_.prefill_pool.Begin(worker, attempt->request.token_ids_size(), hashes_,
                                               /*uncached_only=*/true);
  }
  auto self = shared_from_this();
  worker->prefill->async()->Prefill(&attempt->context, &attempt->request, &attempt->response,
                                    [self, worker, attempt](grpc::Status status) {
                                      self->OnPrefillDone(worker, attempt, status);
                                    });
}

void CallState::OnPrefillDone(Worker* worker, std::shared_ptr<Attempt> attempt,
                              const grpc::Status& status) {
  // The pool may forget a worker gone long once nothing is in flight to it: end after its last
  // use here.
  bool ended = false;
  absl::Cleanup end = [&] {
    if (!ended) env_.prefill_pool.End(worker, attempt->charged);
  };
  tandem::v1::KvHandle kv;
  {
    Lock lock(this);
    if (phase_ == Phase::kDone) return;
    call_.reset();
    if (!status.ok()) {
      if (!IsWorkerFailure(status) || !Retry(env_.prefill_pool, worker, status, false)) {
        Fail(WithContext("prefill on " + worker->address, status));
      }
      return;
    }
    const tandem::v1::PrefillResponse& r = attempt->response;
    if (cached_prompt_tokens_ < 0) {
      cached_prompt_tokens_ = r.cached_prompt_tokens();
      Add(metrics_.cached_prompt_tokens, static_cast<double>(cached_prompt_tokens_));
    }
    // The worker's part is done (and `worker` not used again): its load goes before the first
    // token goes out, since that may start more work for it (the other choices of an HTTP
    // request, n > 1, which should find their prompt's blocks on an idle worker).
    env_.prefill_pool.End(worker, attempt->charged);
    ended = true;
    queue_seconds_ += r.queue_seconds();
    prefill_seconds_ += r.prefill_seconds();
    Observe(metrics_.prefill_time, r.prefill_seconds());
    const FinishReason finish = !sampling_.ignore_eos() && IsEos(r.first_token())
                                    ? tandem::v1::FINISH_REASON_STOP
                                    : tandem::v1::FINISH_REASON_UNSPECIFIED;
    Logprobs first;
    if (r.has_first_token_logprobs()) *first.Add() = r.first_token_logprobs();
    if (r.prompt_logprobs_size() > 0) prompt_logprobs_ = r.prompt_logprobs();
    if (Emit({r.first_token()}, first, finish)) return;
    kv = r.kv();
  }
  StartDecode(kv);
}

void CallState::StartDecode(const tandem::v1::KvHandle& kv) {
  std::shared_ptr<grpc::ClientContext> context = NewContext();
  tandem::v1::DecodeRequest request;
  Worker* worker = nullptr;
  int64_t charged = 0;
  {
    Lock lock(this);
    if (phase_ == Phase::kDone) return;
    worker = env_.decode_pool.PickDecode(hashes_, failed_decode_);
    if (worker == nullptr) {
      Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode worker is available"));
      return;
    }
    phase_ = Phase::kDecode;
    first_decode_message_ = true;
    request.set_request_id(id_);
    for (int32_t t : AllTokens()) request.add_token_ids(t);
    request.set_completion_tokens(static_cast<int>(generated_.size()));
    *request.mutable_sampling() = sampling_;
    *request.mutable_kv() = kv;
    request.set_fail_on_miss(!rescheduled_ && env_.BalancerEngaged());
    call_ = context;
    charged = env_.decode_pool.Begin(worker, request.token_ids_size(), hashes_);
  }
  new DecodeReader(shared_from_this(), worker, charged, std::move(context), std::move(request));
}

bool CallState::OnDecodeMessage(const tandem::v1::DecodeResponse& message) {
  Lock lock(this);
  if (phase_ == Phase::kDone) return false;
  if (first_decode_message_) {
    first_decode_message_ = false;
    // A hit from the store's disk tier is slower but still a hit: the balancer counts it so.
    env_.balancer.RecordLookups(message.kv_hits(), message.kv_misses(), env_.clock.Now());
    const int store_hits = message.kv_store_memory_hits() + message.kv_store_disk_hits();
    Add(metrics_.kv_lookup_hits, std::max(0, message.kv_hits() - store_hits));
    Add(metrics_.kv_lookup_memory_hits, message.kv_store_memory_hits());
    Add(metrics_.kv_lookup_disk_hits, message.kv_store_disk_hits());
    Add(metrics_.kv_lookup_misses, message.kv_misses());
    transfer_seconds_ += message.kv_transfer_seconds();
    // Colocated, no prefill worker reported it: the decode engine's own prefix-cache hits.
    if (cached_prompt_tokens_ < 0) cached_prompt_tokens_ = message.cached_prompt_tokens();
    if (message.prompt_logprobs_size() > 0) prompt_logprobs_ = message.prompt_logprobs();
    Observe(metrics_.kv_transfer_time, message.kv_transfer_seconds());
    // Decode has taken the KV up: it no longer counts as prefilled ahead.
    deferred_.push_back([self = shared_from_this()] { self->ReleasePacing(); });
    if (!running_) {
      running_ = true;
      deferred_.push_back([this, self = shared_from_this()] {
        env_.queue.StartRunning(static_cast<int64_t>(prompt_.size()));
      });
    }
  }
  std::vector<int32_t> tokens(message.token_ids().begin(), message.token_ids().end());
  const FinishReason finish = message.finish_reason();
  if (tokens.empty() && finish == tandem::v1::FINISH_REASON_UNSPECIFIED) return true;
  // A worker that finished ends its stream by itself; anything else that ends the request
  // here (a stop string, max_tokens) cancels it.
  if (finish != tandem::v1::FINISH_REASON_UNSPECIFIED) call_.reset();
  return !Emit(tokens, message.logprobs(), finish) ||
         finish != tandem::v1::FINISH_REASON_UNSPECIFIED;
}

void CallState::OnDecodeDone(Worker* worker, int64_t charged, const grpc::Status& status) {
  absl::Cleanup end = [&] { env_.decode_pool.End(worker, charged); };  // after its last use
  bool reprefill = false;
  {
    Lock lock(this);
    if (phase_ == Phase::kDone) return;
    call_.reset();
    if (status.ok()) {  // the stream ended without a finish reason: a broken worker
      Fail(grpc::Status(grpc::StatusCode::INTERNAL,
                        "decode on " + worker->address + " ended without a finish reason"));
      return;
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && !rescheduled_) {
      // Blocks missed while the balancer is engaged: re-prefill at high priority.
      rescheduled_ = true;
      env_.balancer.RecordReschedule();
      phase_ = Phase::kWaiting;
      reprefill = true;
    } else if (!IsWorkerFailure(status) ||
               !Retry(env_.decode_pool, worker, status, /*high_priority=*/true)) {
      Fail(WithContext("decode on " + worker->address, status));
      return;
    }
  }
  if (reprefill) SchedulePrefill(0, /*high_priority=*/true);
}

bool CallState::Retry(WorkerPool& pool, Worker* worker, const grpc::Status& status,
                      bool high_priority) {
  const bool decode = &pool == &env_.decode_pool;
  if (attempts_ >= env_.options.max_attempts) {
    Log(LogLevel::kError, "router",
        absl::StrCat("request ", id_, ": ", decode ? "decode" : "prefill", " on ", worker->address,
                     " failed (", status.error_message(), "); out of attempts"));
    return false;
  }
  Log(LogLevel::kWarning, "router",
      absl::StrCat("request ", id_, ": ", decode ? "decode" : "prefill", " on ", worker->address,
                   " failed (", status.error_message(), "); ",
                   decode ? absl::StrCat("migrating after ", generated_.size(), " tokens")
                          : std::string("retrying on another worker")));
  pool.MarkFailed(worker);
  (decode ? failed_decode_ : failed_prefill_).push_back(worker);
  phase_ = Phase::kWaiting;
  auto self = shared_from_this();
  deferred_.push_back([self, high_priority] { self->SchedulePrefill(0, high_priority); });
  return true;
}

bool CallState::Emit(const std::vector<int32_t>& tokens, const Logprobs& logprobs,
                     FinishReason finish) {
  absl::StatusOr<OutputAssembler::Delta> delta = output_->Add(tokens);
  if (!delta.ok()) {
    Fail(rpc::ToGrpcStatus(delta.status()));
    return true;
  }
  const int n = static_cast<int>(delta->token_ids.size());
  if (n > 0) {
    tokens_.Add(n, Clock::now(), metrics_.time_to_first_token, metrics_.inter_token_latency);
    Add(metrics_.generation_tokens, n);
  }
  generated_.insert(generated_.end(), delta->token_ids.begin(), delta->token_ids.end());
  const bool at_limit = static_cast<int>(generated_.size()) >= sampling_.max_tokens();
  const bool ending = delta->stopped || finish != tandem::v1::FINISH_REASON_UNSPECIFIED || at_limit;
  if (ending && !delta->stopped) delta->text += output_->Flush();
  if (n > 0 || !delta->text.empty() || prompt_logprobs_due_) {
    GenerateResponse response;
    response.set_request_id(id_);
    tandem::v1::Chunk* chunk = response.mutable_chunk();
    if (prompt_logprobs_due_) {
      prompt_logprobs_due_ = false;
      chunk->mutable_prompt_token_ids()->Add(prompt_.begin(), prompt_.end());
      *chunk->mutable_prompt_logprobs() = std::move(prompt_logprobs_);
    }
    for (int32_t t : delta->token_ids) chunk->add_token_ids(t);
    // The tokens a stop string cut off are gone, and their log-probabilities with them.
    for (int i = 0; i < static_cast<int>(delta->token_ids.size()) && i < logprobs.size(); ++i) {
      *chunk->add_logprobs() = logprobs[i];
    }
    chunk->set_text(std::move(delta->text));
    Send(response);
  }
  if (!ending) return false;
  if (delta->stopped) {
    Complete(tandem::v1::FINISH_REASON_STOP);
  } else if (finish != tandem::v1::FINISH_REASON_UNSPECIFIED) {
    Complete(finish);
  } else {
    Complete(tandem::v1::FINISH_REASON_LENGTH);
  }
  return true;
}

void CallState::Complete(FinishReason reason) {
  const Clock::time_point now = Clock::now();
  GenerateResponse response;
  response.set_request_id(id_);
  tandem::v1::Complete* c = response.mutable_complete();
  c->set_finish_reason(reason);
  c->mutable_usage()->set_prompt_tokens(static_cast<int>(prompt_.size()));
  c->mutable_usage()->set_completion_tokens(static_cast<int>(generated_.size()));
  c->mutable_usage()->set_cached_prompt_tokens(std::max(0, cached_prompt_tokens_));
  tandem::v1::Timings* t = c->mutable_timings();
  t->set_queue(queue_seconds_);
  t->set_prefill(prefill_seconds_);
  t->set_kv_transfer(transfer_seconds_);
  if (tokens_.first_token_at().has_value()) {
    t->set_time_to_first_token(Seconds(*tokens_.first_token_at() - arrival_));
    t->set_decode(Seconds(now - *tokens_.first_token_at()));
  }
  Send(response);
  Observe(metrics_.e2e_request_latency, Seconds(now - arrival_));
  if (tokens_.first_token_at().has_value()) {
    Observe(metrics_.decode_time, Seconds(now - *tokens_.first_token_at()));
  }
  Observe(metrics_.request_queue_time, queue_seconds_);
  if (tokens_.first_token_at().has_value() && reason != tandem::v1::FINISH_REASON_ABORT) {
    const auto n = static_cast<int64_t>(generated_.size());
    env_.workload.RecordFinish(
        n, Seconds(*tokens_.first_token_at() - arrival_),
        n > 1 ? Seconds(now - *tokens_.first_token_at()) / static_cast<double>(n - 1) : 0,
        env_.clock.Now());
  }
  const metrics::RoleMetrics& m = metrics_;
  Add(reason == tandem::v1::FINISH_REASON_STOP     ? m.finished_stop
      : reason == tandem::v1::FINISH_REASON_LENGTH ? m.finished_length
                                                   : m.finished_abort,
      1);
  LeaveRouter(grpc::Status::OK);
}

void GrpcSink::Push(const GenerateResponse& response, std::vector<std::function<void()>>&) {
  grpc::ByteBuffer buffer;
  bool own = false;
  if (grpc::SerializationTraits<GenerateResponse>::Serialize(response, &buffer, &own).ok()) {
    stream_.Push(std::move(buffer));
  }
}

void CallState::Fail(const grpc::Status& status) {
  if (phase_ == Phase::kDone) return;
  Add(status.error_code() == grpc::StatusCode::CANCELLED ? metrics_.finished_abort
                                                         : metrics_.finished_error,
      1);
  LeaveRouter(status);
}

void CallState::LeaveRouter(grpc::Status status) {
  phase_ = Phase::kDone;
  // A stop string, a client cancel or a deadline ends the request while a worker call may
  // still run: cancel it.
  std::shared_ptr<grpc::ClientContext> call = std::move(call_);
  call_.reset();
  std::shared_ptr<security::KeyLease> lease = std::move(lease_);
  lease_.reset();
  const int64_t tokens = static_cast<int64_t>(prompt_.size() + generated_.size());
  // After unlocking, in order: the request's accounting (the pacer may hand back other calls'
  // prefills, which must not start under this call's lock), the worker call's cancel, and only
  // then the end of the stream, so a client that sees the end sees the router's counts settled.
  deferred_.push_back([this, self = shared_from_this(), running = running_, call = std::move(call),
                       status = std::move(status), lease = std::move(lease), tokens]() mutable {
    ReleasePacing();
    env_.queue.Leave(running, static_cast<int64_t>(prompt_.size()));
    if (lease != nullptr) {
      lease->AddTokens(tokens);
      lease.reset();  // its concurrency slot, before the client hears the end
    }
    if (call != nullptr) call->TryCancel();
    sink_->End(status);
  });
}

void CallState::Cancel() {
  Lock lock(this);
  if (phase_ == Phase::kDone) return;
  const bool expired = std::chrono::system_clock::now() >= deadline_;
  Fail(expired ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded")
               : grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
}

bool GrpcSink::CancelIfStalled(Clock::time_point now, Clock::duration timeout) {
  if (!stream_.PinIfStalled(now, timeout)) return false;
  // Pinned: the call cannot finish, so its context is still there.
  Log(LogLevel::kWarning, "router",
      absl::StrCat("a client took no message of its Generate stream for ",
                   absl::FormatDuration(absl::FromChrono(timeout)),
                   " (router.grpc_write_timeout_seconds): cancelled"));
  context_->TryCancel();
  stream_.Unpin();
  if (cut_off_ != nullptr) cut_off_->Increment();
  return true;
}

GenerateCall::GenerateCall(const CallEnvironment& env, grpc::CallbackServerContext* context,
                           const grpc::ByteBuffer& raw, std::shared_ptr<security::KeyLease> lease,
                           StreamWatchdog& watchdog)
    : sink_(std::make_shared<GrpcSink>(this, context, env.metrics.stalled_streams)) {
  const Clock::time_point arrival = Clock::now();
  absl::StatusOr<tandem::v1::GenerateRequest> request = ParseGenerateRequest(raw);
  absl::StatusOr<std::shared_ptr<CallState>> state =
      request.ok() ? StartCall(env, std::move(*request), sink_, context->deadline(), arrival,
                               Door::kGrpc, std::move(lease))
                   : request.status();
  if (!state.ok()) {
    Finish(rpc::ToGrpcStatus(state.status()));
    return;
  }
  state_ = std::move(*state);
  watchdog.Watch(sink_);
}

}  // namespace tandem::router
