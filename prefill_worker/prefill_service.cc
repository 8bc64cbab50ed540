#include "prefill_worker/prefill_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/engine/kv_handoff.h"
#include "common/kv/block_hash.h"
#include "common/rpc/engine_proto.h"
#include "common/rpc/status.h"
#include "common/util/log.h"

namespace tandem::prefill {
namespace {

using Clock = std::chrono::steady_clock;

// The store space reserved for one request's blocks, filled in on an upload thread.
struct Ahead {
  absl::Notification done;
  std::unique_ptr<store::StorePool::Reservation> reservation;
};

}  // namespace

// One Prefill call. The reactor may be finished from three threads (gRPC on cancel, the engine
// loop on error, an upload thread on success); `State` makes the first Finish the only one and
// keeps later callbacks away from a reactor gRPC has already released.
class PrefillCall final : public grpc::ServerUnaryReactor {
 public:
  PrefillCall(PrefillService& service, const tandem::v1::PrefillRequest& request,
              tandem::v1::PrefillResponse* response)
      : service_(service), state_(std::make_shared<State>()) {
    state_->reactor = this;
    state_->response = response;
    Start(request);
  }

  void OnCancel() override {
    service_.loop_.Abort(id_);
    state_->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "prefill cancelled"), nullptr);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
      state_->response = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    absl::Mutex mu;
    bool finished ABSL_GUARDED_BY(mu) = false;
    grpc::ServerUnaryReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    tandem::v1::PrefillResponse* response ABSL_GUARDED_BY(mu) = nullptr;

    bool Done() {
      absl::MutexLock lock(&mu);
      return finished || reactor == nullptr;
    }

    void Finish(const grpc::Status& status, tandem::v1::PrefillResponse* result) {
      absl::MutexLock lock(&mu);
      if (finished || reactor == nullptr) return;
      finished = true;
      if (result != nullptr) *response = std::move(*result);
      reactor->Finish(status);
    }
  };

  void Start(const tandem::v1::PrefillRequest& request) {
    id_ = request.request_id().empty() ? absl::StrCat("prefill-", service_.next_id_.fetch_add(1))
                                       : request.request_id();
    engine::Request r;
    r.id = id_;
    r.prompt.assign(request.token_ids().begin(), request.token_ids().end());
    r.num_generated = request.completion_tokens();
    r.max_tokens = request.completion_tokens() + 1;  // exactly the first (next) token
    r.sampling = rpc::ToSamplingParams(request.sampling());
    r.prompt_logprobs = rpc::PromptLogprobs(request.sampling(), request.completion_tokens());
    r.ignore_eos = true;
    r.high_priority = request.high_priority();
    r.cache_salt = request.cache_salt();
    const uint64_t tenant_salt = request.cache_salt();
    const Clock::time_point start = Clock::now();
    std::vector<int32_t> prompt = r.prompt;
    std::shared_ptr<Ahead> ahead = ReserveAhead(service_, prompt, tenant_salt);
    if (!service_.load_prefixes_) {
      Compute(service_, state_, std::move(r), std::move(prompt), start, tenant_salt, ahead);
      return;
    }
    // The callbacks must not touch `this`: gRPC deletes the call once it is finished (a
    // cancelled call finishes before the engine reports the abort).
    const Clock::time_point queued = Clock::now();
    service_.fetches_->Submit([service = &service_, state = state_, r = std::move(r),
                               prompt = std::move(prompt), start, queued, tenant_salt,
                               ahead]() mutable {
      if (state->Done()) return;  // cancelled while queued
      LoadPrefix(*service, prompt, tenant_salt);
      if (service->on_prefix_lookup_) {
        service->on_prefix_lookup_(std::chrono::duration<double>(Clock::now() - queued).count());
      }
      if (state->Done()) return;
      Compute(*service, state, std::move(r), std::move(prompt), start, tenant_salt, ahead);
    });
  }

  // On a fetch thread: imports the prompt's blocks the store holds beyond those the engine has
  // (the loop runs the import before the request it then gets). Any failure only means more to
  // compute.
  static void LoadPrefix(PrefillService& service, const std::vector<int32_t>& prompt,
                         uint64_t tenant_salt) {
    struct Probe {
      absl::Notification done;
      std::vector<kv::BlockHash> hashes;  // as ExportPromptBlocks will key them
      size_t resident = 0;
    };
    auto probe = std::make_shared<Probe>();
    service.loop_.Post([probe, prompt, tenant_salt](engine::Engine& e) {
      const uint64_t salt = kv::CombineCacheSalts(tenant_salt, e.CacheSalt(prompt));
      probe->hashes = engine::PromptBlockHashes(e, prompt, salt);
      probe->resident = e.kv_cache().FindCachedPrefix(probe->hashes).size();
      probe->done.Notify();
    });
    if (!probe->done.WaitForNotificationWithTimeout(absl::Seconds(30))) return;
    const std::vector<kv::BlockHash>& hashes = probe->hashes;
    const size_t resident = probe->resident;
    service.kv_worker_hits_ += static_cast<int64_t>(resident);
    if (resident >= hashes.size()) return;
    std::vector<store::StoreTier> tiers;
    std::vector<std::optional<std::string>> fetched =
        service.store_.Get(std::span(hashes).subspan(resident), &tiers);
    // Hits are the blocks found up to the first one missing: those after it cannot be used.
    size_t found = 0;
    while (found < fetched.size() && fetched[found].has_value()) {
      ++(tiers[found] == store::StoreTier::kDisk ? service.kv_disk_hits_ : service.kv_memory_hits_);
      ++found;
    }
    service.kv_misses_ += static_cast<int64_t>(hashes.size() - resident - found);
    if (found == 0) return;
    std::vector<std::optional<std::string>> blobs(hashes.size());
    for (size_t i = 0; i < fetched.size(); ++i) blobs[resident + i] = std::move(fetched[i]);
    service.loop_.Post([&service, probe, blobs = std::move(blobs)](engine::Engine& e) {
      const engine::ImportStats s = engine::ImportPromptBlocks(e, probe->hashes, blobs);
      service.loaded_blocks_ +=
          std::max<int64_t>(0, s.hits - static_cast<int64_t>(probe->resident));
    });
  }

  static void Compute(PrefillService& service_ref, std::shared_ptr<State> state_ref,
                      engine::Request r, std::vector<int32_t> prompt, Clock::time_point start,
                      uint64_t tenant_salt, std::shared_ptr<Ahead> ahead) {
    PrefillService* service = &service_ref;
    service->loop_.Submit(
        std::move(r),
        [service, state = std::move(state_ref), prompt = std::move(prompt), start, tenant_salt,
         ahead](const engine::RequestOutput& out, engine::Engine& engine) {
          if (out.finish == engine::FinishReason::kNone) return;
          if (out.finish == engine::FinishReason::kError) {
            state->Finish(rpc::ToGrpcStatus(out.error), nullptr);
            return;
          }
          if (out.finish == engine::FinishReason::kAbort || out.new_tokens.empty()) {
            state->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "prefill aborted"), nullptr);
            return;
          }
          // On the loop thread, before the engine steps again: the blocks are still cached.
          const uint64_t salt = kv::CombineCacheSalts(tenant_salt, engine.CacheSalt(prompt));
          auto exported = engine::ExportPromptBlocks(engine, prompt, salt);
          auto result = std::make_shared<tandem::v1::PrefillResponse>();
          result->set_first_token(out.new_tokens.back());
          if (!out.logprobs.empty()) {
            rpc::ToProto(out.logprobs.back(), result->mutable_first_token_logprobs());
          }
          for (const model::TokenLogprobs& lp : out.prompt_logprobs) {
            rpc::ToProto(lp, result->add_prompt_logprobs());
          }
          result->set_cached_prompt_tokens(out.cached_prompt_tokens);
          // Time in this worker: waiting in the engine's queue, then computing.
          const double here = std::chrono::duration<double>(Clock::now() - start).count();
          result->set_queue_seconds(out.queue_seconds);
          result->set_prefill_seconds(std::max(0.0, here - out.queue_seconds));
          tandem::v1::KvHandle* kv = result->mutable_kv();
          kv->set_model_id(engine.kv_cache().model_id());
          kv->set_cache_salt(salt);
          *kv->mutable_layout() = rpc::ToProto(engine.kv_cache().layout());
          if (!exported.ok()) {
            state->Finish(rpc::ToGrpcStatus(exported.status()), nullptr);
            return;
          }
          MaybeCheckStability(*service, engine, prompt);  // queued before the response leaves
          service->uploads_.Submit(
              [service, state, result, ahead, blocks = std::move(*exported)]() mutable {
                Upload(*service, std::move(blocks), ahead.get(), *result);
                state->Finish(grpc::Status::OK, result.get());
              });
        });
  }

  // The monitor's sample: requests n where floor(n * rate) steps up, so any rate is met exactly
  // over time. The check runs as a loop task: after this step's outputs, before the next step,
  // so the worker's other requests wait for it (two prefills of the prompt, in chunk_size
  // pieces); prompts over kMaxStabilityCheckTokens are not sampled (the check's scratch KV cache
  // lives outside the engine's budget).
  static void MaybeCheckStability(PrefillService& service, engine::Engine& engine,
                                  const std::vector<int32_t>& prompt) {
    const double rate = service.stability_sample_rate_;
    if (rate <= 0 || !service.on_stability_ || !engine.options().pruning.enabled ||
        static_cast<int64_t>(prompt.size()) > kMaxStabilityCheckTokens) {
      return;
    }
    const int64_t n = service.prefilled_.fetch_add(1) + 1;
    if (std::floor(static_cast<double>(n) * rate) ==
        std::floor(static_cast<double>(n - 1) * rate)) {
      return;
    }
    service.loop_.Post([&service, prompt](engine::Engine& e) {
      // A piece per turn on a shared pool: a decode engine beside it waits for one piece at most.
      auto similarity = model::CheckAttentionStability(
          e.model(), prompt, e.options().pruning.settings, e.options().kv_dtype,
          e.options().chunk_size, [&service](const std::function<absl::Status()>& forward) {
            return service.loop_.RunOnTurn(forward);
          });
      if (similarity.ok()) {
        service.on_stability_(*similarity);
      } else {
        Log(LogLevel::kWarning, "prefill",
            absl::StrCat("attention-stability check failed: ", similarity.status().ToString()));
      }
    });
  }

  // With reserve_ahead, reserves the store space of the prompt's blocks on an upload thread, to
  // overlap the engine's compute; null without.
  static std::shared_ptr<Ahead> ReserveAhead(PrefillService& service,
                                             const std::vector<int32_t>& prompt,
                                             uint64_t tenant_salt) {
    const std::optional<engine::ExportPlan>& plan = service.reserve_ahead_;
    if (!plan.has_value() || plan->block_bytes() <= 0) return nullptr;
    std::vector<store::BlockSize> blocks;
    for (kv::BlockHash hash : plan->Hashes(prompt, tenant_salt)) {
      blocks.push_back({hash, plan->block_bytes()});
    }
    if (blocks.empty()) return nullptr;
    auto ahead = std::make_shared<Ahead>();
    // Queued ahead of the request's upload (the queue runs tasks in order), which waits for it.
    service.uploads_.Submit([&service, ahead, blocks = std::move(blocks)] {
      ahead->reservation = service.store_.Reserve(blocks);
      ahead->done.Notify();
    });
    return ahead;
  }

  // Writes the blocks to the store and lists, in the handle, the prefix that got stored (decode
  // could not use a block after a missing one).
  static void Upload(PrefillService& service, std::vector<engine::ExportedBlock> exported,
                     Ahead* ahead, tandem::v1::PrefillResponse& result) {
    std::vector<store::BlockData> blocks;
    blocks.reserve(exported.size());
    for (auto& b : exported) blocks.push_back({b.hash, std::move(b.bytes)});
    const Clock::time_point start = Clock::now();
    // The reservation's task was queued first and is done or running: its RPCs have deadlines.
    if (ahead != nullptr) ahead->done.WaitForNotification();
    store::StorePool::Reservation* reservation =
        ahead != nullptr ? ahead->reservation.get() : nullptr;
    const store::StorePool::PutReport report = service.store_.Put(blocks, reservation);
    ++service.uploads_done_;
    if (report.ahead > 0) ++service.reserved_uploads_;
    if (service.on_transfer_) {
      service.on_transfer_(std::chrono::duration<double>(Clock::now() - start).count());
    }
    service.kv_bytes_ += report.bytes;
    tandem::v1::KvHandle* kv = result.mutable_kv();
    const int block_size = kv->layout().block_size();
    for (size_t i = 0; i < blocks.size() && report.stored[i]; ++i) {
      kv->add_block_hashes(blocks[i].hash);
      kv->add_locations()->set_shard(service.store_.ShardOf(blocks[i].hash));
    }
    kv->set_num_tokens(kv->block_hashes_size() * block_size);
  }

  PrefillService& service_;
  std::shared_ptr<State> state_;
  std::string id_;
};

PrefillService::PrefillService(engine::EngineLoop& loop, store::StorePool& store,
                               const PrefillServiceOptions& options)
    : loop_(loop),
      store_(store),
      uploads_(options.upload_threads),
      on_transfer_(options.on_transfer),
      authorizer_(*options.authorizer),
      stability_sample_rate_(options.stability_sample_rate),
      on_stability_(options.on_stability),
      reserve_ahead_(options.reserve_ahead),
      load_prefixes_(options.load_prefixes),
      on_prefix_lookup_(options.on_prefix_lookup),
      fetches_(options.load_prefixes ? std::make_unique<WorkQueue>(options.fetch_threads)
                                     : nullptr) {}

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext* context,
                                                  const tandem::v1::PrefillRequest* request,
                                                  tandem::v1::PrefillResponse* response) {
  grpc::Status allowed = authorizer_.Check(*context, "/tandem.v1.PrefillWorker/Prefill");
  if (!allowed.ok()) return security::Refuse<grpc::ServerUnaryReactor>(std::move(allowed));
  return new PrefillCall(*this, *request, response);
}

}  // namespace tandem::prefill
