#include "decode_worker/decode_service.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/engine/kv_handoff.h"
#include "common/metrics/token_timing.h"
#include "common/rpc/engine_proto.h"
#include "common/rpc/server_stream.h"
#include "common/rpc/status.h"

namespace tandem::decode {
namespace {

using Clock = std::chrono::steady_clock;
using tandem::v1::DecodeResponse;

}  // namespace

// One Decode stream. Messages come from the engine loop and queue in an rpc::ServerStream;
// `Stream` (the queue plus per-request state) outlives the reactor, since the loop and fetch
// threads hold it.
class DecodeCall final : public grpc::ServerWriteReactor<DecodeResponse> {
 public:
  DecodeCall(DecodeService& service, const tandem::v1::DecodeRequest& request)
      : service_(service), stream_(std::make_shared<Stream>(this)) {
    Start(request);
  }

  void OnWriteDone(bool ok) override { stream_->WriteDone(ok); }

  void OnCancel() override {
    stream_->cancelled = true;
    service_.loop_.Abort(stream_->id);
    stream_->End(grpc::Status(grpc::StatusCode::CANCELLED, "decode cancelled"));
  }

  void OnDone() override { delete this; }

 private:
  using Lookups = DecodeService::Lookups;
  struct Stream : rpc::ServerStream<DecodeResponse> {
    explicit Stream(DecodeCall* reactor) : rpc::ServerStream<DecodeResponse>(reactor) {}
    std::string id;
    std::atomic<bool> cancelled{false};
    Lookups lookups;  // sent with the first message
    double transfer_seconds = 0;
    bool first_sent = false;  // loop thread only
    DecodeResponse pending;   // loop thread only: tokens not yet sent (scheduler.stream_interval)
    metrics::TokenTiming tokens{Clock::now()};  // loop thread only, after Start
  };

  void Start(const tandem::v1::DecodeRequest& request) {
    stream_->id = request.request_id().empty()
                      ? absl::StrCat("decode-", service_.next_id_.fetch_add(1))
                      : request.request_id();
    engine::Request r;
    r.id = stream_->id;
    r.prompt.assign(request.token_ids().begin(), request.token_ids().end());
    r.num_generated = request.completion_tokens();
    r.max_tokens = request.sampling().max_tokens();
    r.sampling = rpc::ToSamplingParams(request.sampling());
    r.prompt_logprobs = rpc::PromptLogprobs(request.sampling(), request.completion_tokens());
    r.ignore_eos = request.sampling().ignore_eos();
    r.cache_salt = request.kv().cache_salt();
    std::vector<uint64_t> hashes(request.kv().block_hashes().begin(),
                                 request.kv().block_hashes().end());
    DecodeService* service = &service_;
    const bool fail_on_miss = request.fail_on_miss();
    service_.fetches_.Submit(
        [service, stream = stream_, r = std::move(r), hashes = std::move(hashes),
         fail_on_miss]() mutable { Admit(*service, stream, std::move(r), hashes, fail_on_miss); });
  }

  // On a fetch thread: brings the blocks in (resident ones are skipped), then hands the
  // request to the engine loop.
  static void Admit(DecodeService& service, std::shared_ptr<Stream> stream, engine::Request r,
                    const std::vector<uint64_t>& hashes, bool fail_on_miss) {
    if (stream->cancelled) return;
    const Clock::time_point start = Clock::now();
    // Shared with the task, which may outlive this wait when the loop is slow to answer.
    struct Probe {
      absl::Notification done;
      size_t resident = 0;
    };
    auto probe = std::make_shared<Probe>();
    service.loop_.Post([probe, hashes](engine::Engine& e) {
      probe->resident = e.kv_cache().FindCachedPrefix(hashes).size();
      probe->done.Notify();
    });
    if (!probe->done.WaitForNotificationWithTimeout(absl::FromChrono(service.engine_timeout_))) {
      stream->End(
          grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat("the decode engine did not answer within ",
                                    absl::FormatDuration(absl::FromChrono(service.engine_timeout_)),
                                    " (overloaded or stuck); try another worker")));
      return;
    }
    const size_t resident = probe->resident;
    std::vector<std::optional<std::string>> blobs(hashes.size());
    std::vector<store::StoreTier> tiers(hashes.size(), store::StoreTier::kNone);
    if (resident < hashes.size()) {
      std::vector<store::StoreTier> found_in;
      auto fetched = service.store_.Get(std::span(hashes).subspan(resident), &found_in);
      for (size_t i = 0; i < fetched.size(); ++i) {
        if (fetched[i].has_value()) service.kv_bytes_ += static_cast<int64_t>(fetched[i]->size());
        blobs[resident + i] = std::move(fetched[i]);
        tiers[resident + i] = found_in[i];
      }
    }
    if (fail_on_miss && RefuseMisses(service, *stream, blobs, tiers, resident)) return;
    service.loop_.Post([&service, stream, hashes, blobs = std::move(blobs),
                        tiers = std::move(tiers), start](engine::Engine& e) {
      const engine::ImportStats s = engine::ImportPromptBlocks(e, hashes, blobs);
      stream->lookups = Lookups::Of(s.hits, s.misses, tiers, s.imported);
      stream->transfer_seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (service.on_transfer_) service.on_transfer_(stream->transfer_seconds);
      service.Record(stream->lookups);
    });
    engine::EngineLoop* loop = &service.loop_;
    loop->Submit(
        std::move(r), [stream, loop, &service](const engine::RequestOutput& out, engine::Engine&) {
          if (stream->cancelled && out.finish == engine::FinishReason::kNone) {
            loop->Abort(out.id);
            return;
          }
          stream->tokens.Add(static_cast<int>(out.new_tokens.size()), Clock::now(),
                             service.time_to_first_token_, service.inter_token_latency_);
          // Tokens gather in `pending`: the first output goes at once (the time to first token),
          // then a message every stream_interval tokens, and the last.
          DecodeResponse& msg = stream->pending;
          for (int32_t t : out.new_tokens) msg.add_token_ids(t);
          for (const model::TokenLogprobs& lp : out.logprobs) rpc::ToProto(lp, msg.add_logprobs());
          for (const model::TokenLogprobs& lp : out.prompt_logprobs) {
            rpc::ToProto(lp, msg.add_prompt_logprobs());
          }
          if (!stream->first_sent) {
            stream->lookups.Fill(msg);
            msg.set_kv_transfer_seconds(stream->transfer_seconds);
            msg.set_cached_prompt_tokens(out.cached_prompt_tokens);
          }
          if (out.finish == engine::FinishReason::kError) {
            // What was made before the failure still goes out.
            if (msg.token_ids_size() > 0) stream->Push(std::exchange(msg, {}));
            stream->End(rpc::ToGrpcStatus(out.error));
            return;
          }
          const bool last = out.finish != engine::FinishReason::kNone;
          if (stream->first_sent && !last && msg.token_ids_size() < service.stream_interval_)
            return;
          stream->first_sent = true;
          msg.set_finish_reason(rpc::ToProto(out.finish));
          stream->Push(std::exchange(msg, {}));
          if (last) stream->End(grpc::Status::OK);
        });
  }

  // A block after a missing one is useless, so the usable prefix ends at the first gap. With
  // misses, reports the lookups and ends the call without computing anything.
  static bool RefuseMisses(DecodeService& service, Stream& stream,
                           const std::vector<std::optional<std::string>>& blobs,
                           const std::vector<store::StoreTier>& tiers, size_t resident) {
    size_t usable = resident;
    std::vector<size_t> fetched;
    while (usable < blobs.size() && blobs[usable].has_value()) fetched.push_back(usable++);
    const int misses = static_cast<int>(blobs.size() - usable);
    if (misses == 0) return false;
    const Lookups lookups = Lookups::Of(static_cast<int>(usable), misses, tiers, fetched);
    service.Record(lookups);
    DecodeResponse msg;
    lookups.Fill(msg);
    stream.Push(std::move(msg));
    stream.End(grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat(misses, " of ", blobs.size(), " KV blocks missed in the cache store")));
    return true;
  }

  DecodeService& service_;
  std::shared_ptr<Stream> stream_;
};

DecodeService::DecodeService(engine::EngineLoop& loop, store::StorePool& store,
                             const DecodeServiceOptions& options)
    : loop_(loop),
      store_(store),
      fetches_(options.fetch_threads),
      engine_timeout_(options.engine_timeout),
      stream_interval_(std::max(1, options.stream_interval)),
      on_transfer_(options.on_transfer),
      time_to_first_token_(options.time_to_first_token),
      inter_token_latency_(options.inter_token_latency),
      authorizer_(*options.authorizer) {}

grpc::ServerWriteReactor<DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const tandem::v1::DecodeRequest* request) {
  grpc::Status allowed = authorizer_.Check(*context, "/tandem.v1.DecodeWorker/Decode");
  if (!allowed.ok()) {
    return security::Refuse<grpc::ServerWriteReactor<DecodeResponse>>(std::move(allowed));
  }
  return new DecodeCall(*this, *request);
}

DecodeService::Lookups DecodeService::Lookups::Of(int hits, int misses,
                                                  const std::vector<store::StoreTier>& tiers,
                                                  const std::vector<size_t>& fetched) {
  Lookups l{.hits = hits, .misses = misses};
  for (size_t i : fetched) ++(tiers[i] == store::StoreTier::kDisk ? l.disk : l.memory);
  return l;
}

void DecodeService::Lookups::Fill(DecodeResponse& first_message) const {
  first_message.set_kv_hits(hits);
  first_message.set_kv_misses(misses);
  first_message.set_kv_store_memory_hits(memory);
  first_message.set_kv_store_disk_hits(disk);
}

void DecodeService::Record(const Lookups& lookups) {
  kv_hits_ += lookups.hits;
  kv_misses_ += lookups.misses;
  kv_worker_hits_ += lookups.hits - lookups.memory - lookups.disk;
  kv_memory_hits_ += lookups.memory;
  kv_disk_hits_ += lookups.disk;
}

}  // namespace tandem::decode
