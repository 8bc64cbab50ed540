#include "bench/serving/load_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/serving/generate_call.h"
#include "common/rpc/status.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

constexpr absl::Duration kTick = absl::Milliseconds(100);

// Counts calls in flight and finished. Written by the sending thread (Started) and gRPC's
// threads (Finished); the sending thread waits on it.
class CallTracker {
 public:
  void Started() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  void Finished(bool ok) {
    absl::MutexLock lock(&mu_);
    --in_flight_;
    ++done_;
    if (!ok) ++failed_;
  }
  // Waits up to `timeout` for fewer than `limit` calls in flight; true when there are.
  bool WaitForSlot(int64_t limit, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto free = [this, limit]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ < limit; };
    return mu_.AwaitWithTimeout(absl::Condition(&free), timeout);
  }
  // Waits up to `timeout` for `total` calls to have finished; true when they have.
  bool WaitForDone(int64_t total, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all = [this, total]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= total; };
    return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  }
  void Fill(Progress& p) {
    absl::MutexLock lock(&mu_);
    p.done = done_;
    p.failed = failed_;
    p.in_flight = in_flight_;
  }

 private:
  absl::Mutex mu_;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
};

// Progress reports of one run, at most one per tick.
class ProgressReporter {
 public:
  ProgressReporter(const LoadOptions& options, CallTracker& tracker, const RunClock& clock,
                   int64_t total)
      : options_(options), tracker_(tracker), clock_(clock), total_(total) {}

  void Tick(int64_t sent, bool final = false) {
    if (!options_.on_progress) return;
    double now = clock_.Now();
    if (!final && now - last_s_ < absl::ToDoubleSeconds(kTick)) return;
    last_s_ = now;
    Progress p{.total = total_, .sent = sent, .elapsed_s = now};
    tracker_.Fill(p);
    options_.on_progress(p, final);
  }

 private:
  const LoadOptions& options_;
  CallTracker& tracker_;
  const RunClock& clock_;
  int64_t total_;
  double last_s_ = -1;
};

}  // namespace

LoadClient::LoadClient(const std::string& addr, int connections, const std::string& api,
                       std::string authorization, const std::string& ca_pem)
    : addr_(addr),
      connections_(std::max(connections, 1)),
      authorization_(std::move(authorization)),
      ca_pem_(ca_pem) {
  if (api == "http") return;  // Connect creates the HTTP calls
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!ca_pem.empty()) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ca_pem;
    credentials = grpc::SslCredentials(tls);
  }
  for (int i = 0; i < connections_; ++i) {
    grpc::ChannelArguments args;
    // Channels with different arguments never share a subchannel, hence a connection.
    args.SetInt("tandem.bench.connection", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(-1);
    channels_.push_back(grpc::CreateCustomChannel(addr, credentials, args));
    stubs_.push_back(tandem::v1::Inference::NewStub(channels_.back()));
  }
}

LoadClient::~LoadClient() = default;

absl::Status LoadClient::Connect(double timeout_s) {
  if (channels_.empty()) {
    TANDEM_ASSIGN_OR_RETURN(http_,
                            HttpCalls::Create(addr_, std::min(connections_, 4), authorization_,
                                              ca_pem_));
    return http_->GetModel(timeout_s).status();
  }
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  for (auto& channel : channels_) channel->GetState(/*try_to_connect=*/true);
  for (auto& channel : channels_) {
    for (;;) {
      grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
      if (state == GRPC_CHANNEL_READY) break;
      // A refused connection fails at once rather than retrying until the deadline.
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
        return absl::UnavailableError(absl::StrCat("cannot connect to ", addr_));
      }
      if (!channel->WaitForStateChange(state, deadline)) {
        return absl::UnavailableError(
            absl::StrCat("cannot connect to ", addr_, " within ", timeout_s, " s"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<tandem::v1::ModelInfo> LoadClient::GetModelInfo(double timeout_s) {
  if (http_ != nullptr) {  // what /v1/models says: no vocabulary size
    TANDEM_ASSIGN_OR_RETURN(HttpModelInfo m, http_->GetModel(timeout_s));
    tandem::v1::ModelInfo info;
    info.set_name(m.name);
    info.set_context_length(static_cast<int32_t>(m.context_length));
    return info;
  }
  grpc::ClientContext context;
  if (!authorization_.empty()) context.AddMetadata("authorization", authorization_);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(
                           std::chrono::duration<double>(timeout_s)));
  tandem::v1::ModelInfo info;
  grpc::Status status = stubs_[0]->GetModelInfo(&context, tandem::v1::GetModelInfoRequest(), &info);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return info;
}

LoadResult LoadClient::Run(const std::vector<BenchRequest>& requests,
                           const std::vector<double>& offsets_s, const LoadOptions& options) {
  const size_t n = std::min(requests.size(), offsets_s.size());
  LoadResult result;
  result.records.resize(n);
  // Shared with the calls: the last Finished may still be inside its unlock when Run returns.
  auto tracker = std::make_shared<CallTracker>();
  RunClock clock;
  ProgressReporter progress(options, *tracker, clock, static_cast<int64_t>(n));
  const auto timeout = std::chrono::duration<double>(options.timeout_s);
  for (size_t i = 0; i < n; ++i) {
    // Sleep in ticks so the progress bar moves during long gaps at low rates.
    for (double wait = offsets_s[i] - clock.Now(); wait > 0; wait = offsets_s[i] - clock.Now()) {
      progress.Tick(static_cast<int64_t>(i));
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::min(wait, absl::ToDoubleSeconds(kTick))));
    }
    while (options.max_concurrency > 0 && !tracker->WaitForSlot(options.max_concurrency, kTick)) {
      progress.Tick(static_cast<int64_t>(i));
    }
    progress.Tick(static_cast<int64_t>(i));
    RequestRecord& record = result.records[i];
    record.scheduled_s = offsets_s[i];
    tracker->Started();
    auto done = [tracker](bool ok) { tracker->Finished(ok); };
    if (http_ != nullptr) {
      http_->Start(requests[i], timeout, clock, record, std::move(done));
    } else {
      GenerateCall::Start(*stubs_[i % stubs_.size()], requests[i], timeout, clock, record,
                          std::move(done), authorization_);
    }
  }
  while (!tracker->WaitForDone(static_cast<int64_t>(n), kTick)) {
    progress.Tick(static_cast<int64_t>(n));
  }
  progress.Tick(static_cast<int64_t>(n), /*final=*/true);
  for (const RequestRecord& r : result.records)
    result.duration_s = std::max(result.duration_s, r.end_s);
  return result;
}

}  // namespace tandem::bench
