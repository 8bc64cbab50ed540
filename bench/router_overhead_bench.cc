// What the router adds to every streamed token, measured against fake workers.
//
//   router-overhead-bench fake-workers --listen HOST:PORT [--valid-ids V]
//       Serves PrefillWorker and DecodeWorker with no model, for throughput runs with
//       `tandem bench`: the first token comes back at once, decode streams one token per message
//       as fast as gRPC takes them (ids below V, default 4096, so the router can detokenize).
//   router-overhead-bench latency --tandem BIN --model DIR [--streams N] [--tokens T]
//       [--rounds R] [--token-interval-us U] [--phase aligned|spread] [--router-cpu C]
//       [--bench-cpu C] [--proxy callback|hybrid|async]
//       Starts paced fake workers in this process and `BIN router` (pinned to its own core)
//       in front of them, opens N concurrent streams of T tokens through the router and, for
//       comparison, straight from the fake decode worker, and prints the per-token delivery
//       latency of both (p50/p90/p99/max) and the difference: the router's added latency per
//       streamed token, detokenization included, and the router's CPU time per token. --proxy
//       puts a bare gRPC proxy (this binary) in the router's place instead: the floor.
#include <grpcpp/grpcpp.h>

#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/server_stream.h"
#include "common/util/cli_args.h"
#include "common/util/status_macros.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::bench {
namespace {

class FakePrefill final : public tandem::v1::PrefillWorker::CallbackService {
 public:
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest*,
                                    tandem::v1::PrefillResponse* response) override {
    response->set_first_token(1);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// Streams the tokens a DecodeRequest still needs, one per message, as fast as gRPC takes them.
class FakeStream final : public grpc::ServerWriteReactor<tandem::v1::DecodeResponse> {
 public:
  FakeStream(int remaining, int32_t vocab) : remaining_(remaining), vocab_(vocab) { Next(); }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (remaining_ == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    message_.Clear();
    message_.add_token_ids(1 + (remaining_ % (vocab_ - 1)));
    if (--remaining_ == 0) message_.set_finish_reason(tandem::v1::FINISH_REASON_LENGTH);
    StartWrite(&message_);
  }

  int remaining_;
  const int32_t vocab_;
  tandem::v1::DecodeResponse message_;
};

class FakeDecode final : public tandem::v1::DecodeWorker::CallbackService {
 public:
  explicit FakeDecode(int32_t vocab) : vocab_(vocab) {}
  grpc::ServerWriteReactor<tandem::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext*, const tandem::v1::DecodeRequest* request) override {
    return new FakeStream(
        std::max(0, request->sampling().max_tokens() - request->completion_tokens()), vocab_);
  }

 private:
  const int32_t vocab_;
};

absl::Status ServeFakes(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(std::string listen, args.String("listen"));
  TANDEM_ASSIGN_OR_RETURN(int64_t vocab, args.IntOr("valid-ids", 4096));
  if (vocab < 2) return absl::InvalidArgumentError("--valid-ids must be at least 2");
  FakePrefill prefill;
  FakeDecode decode(static_cast<int32_t>(vocab));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&prefill);
  builder.RegisterService(&decode);
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::UnavailableError("cannot listen on " + listen);
  std::printf("fake workers on %s:%d\n", listen.substr(0, listen.rfind(':')).c_str(), port);
  std::fflush(stdout);
  server->Wait();
  return absl::OkStatus();
}

// --- bare proxies ------------------------------------------------------------------------------
// What any gRPC proxy in the router's place costs on this machine: Generate forwarded to the
// fake decode worker, each DecodeResponse turned into a GenerateResponse chunk, nothing else
// (no tokenizer, no state). `callback` uses gRPC's callback API as the router does; `async`
// drives one completion queue from one thread; `hybrid` serves with callbacks but reads the
// upstream streams through one completion queue and thread.

// With `cq` (the `hybrid` proxy) the upstream stream is read through that completion queue, which
// one thread drives, instead of a callback reactor.
class CallbackProxy final : public tandem::v1::Inference::CallbackService {
 public:
  CallbackProxy(tandem::v1::DecodeWorker::Stub& upstream, grpc::CompletionQueue* cq)
      : upstream_(upstream), cq_(cq) {}

  grpc::ServerWriteReactor<tandem::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const tandem::v1::GenerateRequest* request) override {
    if (cq_ != nullptr) return new CqCall(upstream_, *request, cq_);
    return new Call(upstream_, *request);
  }

  // A completion-queue tag: runs `on(ok)` of its owner.
  struct Tag {
    std::function<void(bool)> on;
  };

 private:
  class Call;
  class CqCall final : public grpc::ServerWriteReactor<tandem::v1::GenerateResponse> {
   public:
    CqCall(tandem::v1::DecodeWorker::Stub& upstream, const tandem::v1::GenerateRequest& request,
           grpc::CompletionQueue* cq)
        : stream_(this) {
      tandem::v1::DecodeRequest up;
      up.set_request_id(request.request_id());
      for (int32_t t : request.prompt_token_ids()) up.add_token_ids(t);
      *up.mutable_sampling() = request.sampling();
      started_.on = [this](bool ok) {
        if (ok) {
          reader_->Read(&message_, &read_);
        } else {
          reader_->Finish(&status_, &finished_);
        }
      };
      read_.on = [this](bool ok) {
        if (!ok) {
          reader_->Finish(&status_, &finished_);
          return;
        }
        tandem::v1::GenerateResponse out;
        *out.mutable_chunk()->mutable_token_ids() = message_.token_ids();
        stream_.Push(std::move(out));
        reader_->Read(&message_, &read_);
      };
      finished_.on = [this](bool) { stream_.End(status_); };
      reader_ = upstream.PrepareAsyncDecode(&context_, up, cq);
      reader_->StartCall(&started_);
    }
    void OnWriteDone(bool ok) override { stream_.WriteDone(ok); }
    void OnDone() override { delete this; }

   private:
    rpc::ServerStream<tandem::v1::GenerateResponse> stream_;
    grpc::ClientContext context_;
    std::unique_ptr<grpc::ClientAsyncReader<tandem::v1::DecodeResponse>> reader_;
    tandem::v1::DecodeResponse message_;
    grpc::Status status_;
    Tag started_, read_, finished_;
  };
  // Reads upstream; writes go through a ServerStream as in the router.
  class Reader final : public grpc::ClientReadReactor<tandem::v1::DecodeResponse> {
   public:
    explicit Reader(Call* call) : call_(call) {}
    void OnReadDone(bool ok) override;
    void OnDone(const grpc::Status& status) override;
    grpc::ClientContext context;
    tandem::v1::DecodeRequest request;
    tandem::v1::DecodeResponse message;

   private:
    Call* const call_;
  };
  class Call final : public grpc::ServerWriteReactor<tandem::v1::GenerateResponse> {
   public:
    Call(tandem::v1::DecodeWorker::Stub& upstream, const tandem::v1::GenerateRequest& request)
        : stream_(this), reader_(new Reader(this)) {
      reader_->request.set_request_id(request.request_id());
      for (int32_t t : request.prompt_token_ids()) reader_->request.add_token_ids(t);
      *reader_->request.mutable_sampling() = request.sampling();
      upstream.async()->Decode(&reader_->context, &reader_->request, reader_);
      reader_->StartRead(&reader_->message);
      reader_->StartCall();
    }
    void OnWriteDone(bool ok) override { stream_.WriteDone(ok); }
    void OnDone() override { delete this; }
    rpc::ServerStream<tandem::v1::GenerateResponse> stream_;

   private:
    Reader* reader_;
  };
  tandem::v1::DecodeWorker::Stub& upstream_;
  grpc::CompletionQueue* const cq_;
};

void CallbackProxy::Reader::OnReadDone(bool ok) {
  if (!ok) return;
  tandem::v1::GenerateResponse out;
  *out.mutable_chunk()->mutable_token_ids() = message.token_ids();
  call_->stream_.Push(std::move(out));
  StartRead(&message);
}

void CallbackProxy::Reader::OnDone(const grpc::Status& status) {
  call_->stream_.End(status);
  delete this;
}

// One Generate call on the async proxy: a small state machine driven by completion-queue tags.
class AsyncProxyCall {
 public:
  struct Tag {
    AsyncProxyCall* call;
    void (AsyncProxyCall::*on)(bool ok);
    void Run(bool ok) { (call->*on)(ok); }
  };

  AsyncProxyCall(tandem::v1::Inference::AsyncService& service,
                 tandem::v1::DecodeWorker::Stub& upstream, grpc::ServerCompletionQueue* cq)
      : service_(service), upstream_(upstream), cq_(cq), writer_(&server_context_) {
    service_.RequestGenerate(&server_context_, &request_, &writer_, cq_, cq_, &accepted_);
  }

 private:
  void OnAccepted(bool ok) {
    if (!ok) {  // shutting down
      delete this;
      return;
    }
    new AsyncProxyCall(service_, upstream_, cq_);  // the next call
    tandem::v1::DecodeRequest up;
    up.set_request_id(request_.request_id());
    for (int32_t t : request_.prompt_token_ids()) up.add_token_ids(t);
    *up.mutable_sampling() = request_.sampling();
    reader_ = upstream_.PrepareAsyncDecode(&client_context_, up, cq_);
    reader_->StartCall(&started_);
  }
  void OnStarted(bool ok) {
    if (!ok) {
      reader_->Finish(&status_, &finished_upstream_);
      return;
    }
    reader_->Read(&message_, &read_);
  }
  void OnRead(bool ok) {
    if (!ok) {
      reader_->Finish(&status_, &finished_upstream_);
      return;
    }
    tandem::v1::GenerateResponse out;
    *out.mutable_chunk()->mutable_token_ids() = message_.token_ids();
    queue_.push_back(std::move(out));
    if (!writing_) WriteNext();
    reader_->Read(&message_, &read_);
  }
  void WriteNext() {
    if (queue_.empty()) {
      if (upstream_done_) writer_.Finish(status_, &finished_);
      return;
    }
    writing_ = true;
    writer_.Write(queue_.front(), &written_);
  }
  void OnWritten(bool ok) {
    writing_ = false;
    queue_.pop_front();
    if (!ok) queue_.clear();
    WriteNext();
  }
  void OnUpstreamFinished(bool) {
    upstream_done_ = true;
    if (!writing_) WriteNext();
  }
  void OnFinished(bool) { delete this; }

  tandem::v1::Inference::AsyncService& service_;
  tandem::v1::DecodeWorker::Stub& upstream_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext server_context_;
  tandem::v1::GenerateRequest request_;
  grpc::ServerAsyncWriter<tandem::v1::GenerateResponse> writer_;
  grpc::ClientContext client_context_;
  std::unique_ptr<grpc::ClientAsyncReader<tandem::v1::DecodeResponse>> reader_;
  tandem::v1::DecodeResponse message_;
  grpc::Status status_;
  std::deque<tandem::v1::GenerateResponse> queue_;
  bool writing_ = false;
  bool upstream_done_ = false;
  Tag accepted_{this, &AsyncProxyCall::OnAccepted};
  Tag started_{this, &AsyncProxyCall::OnStarted};
  Tag read_{this, &AsyncProxyCall::OnRead};
  Tag written_{this, &AsyncProxyCall::OnWritten};
  Tag finished_upstream_{this, &AsyncProxyCall::OnUpstreamFinished};
  Tag finished_{this, &AsyncProxyCall::OnFinished};
};

absl::Status ServeProxy(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(std::string upstream_address, args.String("upstream"));
  const std::string api = args.StringOr("api", "async");
  if (api != "async" && api != "callback" && api != "hybrid") {
    return absl::InvalidArgumentError("--api must be async, callback or hybrid");
  }
  auto upstream = tandem::v1::DecodeWorker::NewStub(
      grpc::CreateChannel(upstream_address, grpc::InsecureChannelCredentials()));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  grpc::CompletionQueue client_cq;
  CallbackProxy callback(*upstream, api == "hybrid" ? &client_cq : nullptr);
  tandem::v1::Inference::AsyncService async;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::thread client_thread;
  if (api != "async") {
    builder.RegisterService(&callback);
    client_thread = std::thread([&client_cq] {
      void* tag = nullptr;
      bool ok = false;
      while (client_cq.Next(&tag, &ok)) static_cast<CallbackProxy::Tag*>(tag)->on(ok);
    });
  } else {
    builder.RegisterService(&async);
    cq = builder.AddCompletionQueue();
  }
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::UnavailableError("cannot start the proxy");
  std::printf("proxy serving on 127.0.0.1:%d;\n", port);
  std::fflush(stdout);
  if (cq == nullptr) {
    server->Wait();
    client_cq.Shutdown();
    client_thread.join();
    return absl::OkStatus();
  }
  new AsyncProxyCall(async, *upstream, cq.get());
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<AsyncProxyCall::Tag*>(tag)->Run(ok);
  return absl::OkStatus();
}

// --- latency ---------------------------------------------------------------------------------
// One process holds the fake workers and the client, so a token's send and receive times come
// from one clock: the fake decode worker records when it sent each token of each request id,
// the client when it received it. A single pacer thread plays the decode engine: every
// `interval` it emits one token for every open stream (`aligned`, as one batched decode step
// does) or spreads the streams evenly over the interval (`spread`).

using Clock = std::chrono::steady_clock;

// Send and receive times of every token, by request id.
class Ledger {
 public:
  void Sent(const std::string& id, Clock::time_point t) {
    absl::MutexLock lock(&mu_);
    sent_[id].push_back(t);
  }
  void Received(const std::string& id, int count, Clock::time_point t) {
    absl::MutexLock lock(&mu_);
    auto& v = received_[id];
    v.insert(v.end(), count, t);
  }
  // Latencies (us) of every token received, sorted; clears the ledger.
  std::vector<int64_t> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<int64_t> out;
    for (const auto& [id, got] : received_) {
      const auto& sent = sent_[id];
      for (size_t i = 0; i < got.size() && i < sent.size(); ++i) {
        out.push_back(std::chrono::duration_cast<std::chrono::microseconds>(got[i] - sent[i])
                          .count());
      }
    }
    sent_.clear();
    received_.clear();
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::vector<Clock::time_point>> sent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Clock::time_point>> received_ ABSL_GUARDED_BY(mu_);
};

class PacedDecode;

// One Decode call of the paced fake worker.
class PacedStream final : public grpc::ServerWriteReactor<tandem::v1::DecodeResponse> {
 public:
  PacedStream(PacedDecode& owner, std::string id, int remaining)
      : owner_(owner), id_(std::move(id)), remaining_(remaining), stream_(this) {}
  // Called by the pacer; false once the stream has ended.
  bool Tick(Ledger& ledger, int32_t vocab) {
    if (remaining_ <= 0 || cancelled_) {
      stream_.End(grpc::Status::OK);
      return false;
    }
    tandem::v1::DecodeResponse m;
    m.add_token_ids(1 + (remaining_ % (vocab - 1)));
    if (--remaining_ == 0) m.set_finish_reason(tandem::v1::FINISH_REASON_LENGTH);
    ledger.Sent(id_, Clock::now());
    stream_.Push(std::move(m));
    return true;
  }
  void OnWriteDone(bool ok) override { stream_.WriteDone(ok); }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override;

 private:
  PacedDecode& owner_;
  const std::string id_;
  int remaining_;  // pacer thread only
  std::atomic<bool> cancelled_{false};
  rpc::ServerStream<tandem::v1::DecodeResponse> stream_;
};

class PacedDecode final : public tandem::v1::DecodeWorker::CallbackService {
 public:
  PacedDecode(Ledger& ledger, int32_t vocab, std::chrono::microseconds interval, bool spread)
      : ledger_(ledger), vocab_(vocab), interval_(interval), spread_(spread) {
    pacer_ = std::thread([this] { Pace(); });
  }
  ~PacedDecode() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    pacer_.join();
  }
  grpc::ServerWriteReactor<tandem::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext*, const tandem::v1::DecodeRequest* request) override {
    auto* s = new PacedStream(
        *this, request->request_id(),
        std::max(0, request->sampling().max_tokens() - request->completion_tokens()));
    absl::MutexLock lock(&mu_);
    ++alive_;
    open_.push_back(s);
    return s;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    --alive_;
  }
  void WaitIdle() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &alive_));
  }

 private:
  // Slot k of n in each interval belongs to the streams with index % n == k (n = 1 when
  // aligned, the number of streams when spread).
  void Pace() {
    auto next = Clock::now();
    int slot = 0;
    for (;;) {
      std::vector<PacedStream*> due;
      int slots = 1;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        slots = spread_ ? std::max<int>(1, static_cast<int>(open_.size())) : 1;
        slot %= slots;
        for (size_t i = slot; i < open_.size(); i += slots) due.push_back(open_[i]);
      }
      std::vector<PacedStream*> ended;
      for (PacedStream* s : due) {
        if (!s->Tick(ledger_, vocab_)) ended.push_back(s);
      }
      if (!ended.empty()) {
        absl::MutexLock lock(&mu_);
        std::erase_if(open_, [&](PacedStream* s) {
          return std::find(ended.begin(), ended.end(), s) != ended.end();
        });
      }
      next += interval_ / slots;
      ++slot;
      std::this_thread::sleep_until(next);
    }
  }

  Ledger& ledger_;
  const int32_t vocab_;
  const std::chrono::microseconds interval_;
  const bool spread_;
  absl::Mutex mu_;
  std::vector<PacedStream*> open_ ABSL_GUARDED_BY(mu_);
  int alive_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread pacer_;
};

void PacedStream::OnDone() {
  owner_.Done();
  delete this;
}

// Reads one stream, recording each token's arrival after the first `skip` (the router's first
// token comes from prefill, not from the paced decode stream).
template <typename Message>
class Reader final : public grpc::ClientReadReactor<Message> {
 public:
  Reader(Ledger& ledger, std::string id, int skip, absl::BlockingCounter& done)
      : ledger_(ledger), id_(std::move(id)), skip_(skip), done_(done) {}
  grpc::ClientContext* context() { return &context_; }
  void Start() {
    this->StartRead(&message_);
    this->StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    int n = TokenCount(message_);
    const int skipped = std::min(n, skip_);
    skip_ -= skipped;
    n -= skipped;
    if (n > 0) ledger_.Received(id_, n, Clock::now());
    this->StartRead(&message_);
  }
  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) {
      std::fprintf(stderr, "stream %s: %s\n", id_.c_str(), status.error_message().c_str());
    }
    done_.DecrementCount();
    delete this;
  }

 private:
  static int TokenCount(const tandem::v1::DecodeResponse& m) { return m.token_ids_size(); }
  static int TokenCount(const tandem::v1::GenerateResponse& m) {
    return m.chunk().token_ids_size();
  }
  Ledger& ledger_;
  const std::string id_;
  int skip_;
  absl::BlockingCounter& done_;
  grpc::ClientContext context_;
  Message message_;
};

double Percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  return static_cast<double>(sorted[static_cast<size_t>(p * (sorted.size() - 1))]);
}

// CPU time (ns) of every thread of `pid` so far, from /proc/PID/task/*/schedstat.
int64_t ProcessCpuNanos(pid_t pid) {
  int64_t total = 0;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  for (const auto& task : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(task.path() / "schedstat");
    int64_t ns = 0;
    if (in >> ns) total += ns;
  }
  return total;
}

// Starts `argv` (a router, or this binary as a proxy) on `cpu`; returns its pid and address once
// it prints "serving on ADDRESS;".
absl::StatusOr<std::pair<pid_t, std::string>> Spawn(std::vector<std::string> argv_s, int cpu) {
  const std::string tandem = argv_s[0];
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);
    }
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(tandem.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    const std::string s(line);
    const size_t at = s.find("serving on ");
    if (at == std::string::npos) continue;
    const size_t begin = at + 11;
    const size_t end = s.find(';', begin);
    std::thread([f] {  // keep draining the router's output
      char sink[512];
      while (std::fgets(sink, sizeof(sink), f) != nullptr) {
      }
      std::fclose(f);
    }).detach();
    return std::pair{pid, s.substr(begin, end - begin)};
  }
  std::fclose(f);
  waitpid(pid, nullptr, 0);
  return absl::UnavailableError("the router exited before serving (see its stderr)");
}

absl::Status RunLatency(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(std::string tandem, args.String("tandem"));
  TANDEM_ASSIGN_OR_RETURN(std::string model, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(int64_t streams, args.IntOr("streams", 16));
  TANDEM_ASSIGN_OR_RETURN(int64_t tokens, args.IntOr("tokens", 300));
  TANDEM_ASSIGN_OR_RETURN(int64_t rounds, args.IntOr("rounds", 5));
  TANDEM_ASSIGN_OR_RETURN(int64_t interval, args.IntOr("token-interval-us", 10000));
  const std::string phase = args.StringOr("phase", "aligned");
  const std::string proxy = args.StringOr("proxy", "");  // instead of the router
  TANDEM_ASSIGN_OR_RETURN(int64_t router_cpu, args.IntOr("router-cpu", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t bench_cpu, args.IntOr("bench-cpu", 1));
  TANDEM_ASSIGN_OR_RETURN(int64_t vocab, args.IntOr("valid-ids", 4096));
  if (phase != "aligned" && phase != "spread") {
    return absl::InvalidArgumentError("--phase must be aligned or spread");
  }
  if (bench_cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(bench_cpu), &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  Ledger ledger;
  if (vocab < 2) return absl::InvalidArgumentError("--valid-ids must be at least 2");
  FakePrefill prefill;
  PacedDecode decode(ledger, static_cast<int32_t>(vocab), std::chrono::microseconds(interval),
                     phase == "spread");
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&prefill);
  builder.RegisterService(&decode);
  auto server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::UnavailableError("cannot start fake workers");
  const std::string fake = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> argv = {tandem,  "router",      "--model",          model,
                                   "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                   "--set",    "router.prefill_workers=[" + fake + "]",
                                   "--set",    "router.decode_workers=[" + fake + "]"};
  if (!proxy.empty()) {
    argv = {"/proc/self/exe", "proxy", "--upstream", fake, "--api", proxy};
  }
  TANDEM_ASSIGN_OR_RETURN(auto router, Spawn(argv, static_cast<int>(router_cpu)));
  auto inference = tandem::v1::Inference::NewStub(
      grpc::CreateChannel(router.second, grpc::InsecureChannelCredentials()));
  auto direct = tandem::v1::DecodeWorker::NewStub(
      grpc::CreateChannel(fake, grpc::InsecureChannelCredentials()));

  // Opens every stream of one round on one path and returns the sorted latencies.
  auto measure = [&](bool through_router, int round) {
    absl::BlockingCounter done(static_cast<int>(streams));
    for (int i = 0; i < streams; ++i) {
      const std::string id = absl::StrCat(through_router ? "r" : "d", round, "-", i);
      const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(120);
      if (through_router) {
        auto* r = new Reader<tandem::v1::GenerateResponse>(ledger, id, proxy.empty() ? 1 : 0, done);
        r->context()->set_deadline(deadline);
        tandem::v1::GenerateRequest req;
        req.set_request_id(id);
        req.add_prompt_token_ids(1);
        req.mutable_sampling()->set_max_tokens(static_cast<int>(tokens));
        req.mutable_sampling()->set_ignore_eos(true);
        inference->async()->Generate(r->context(), &req, r);
        r->Start();
      } else {
        auto* r = new Reader<tandem::v1::DecodeResponse>(ledger, id, 0, done);
        r->context()->set_deadline(deadline);
        tandem::v1::DecodeRequest req;
        req.set_request_id(id);
        req.add_token_ids(1);
        req.mutable_sampling()->set_max_tokens(static_cast<int>(tokens));
        direct->async()->Decode(r->context(), &req, r);
        r->Start();
      }
    }
    done.Wait();
    decode.WaitIdle();
    return ledger.Take();
  };

  std::printf("%d streams, a token every %lld us per stream (%s), %lld tokens each\n",
              static_cast<int>(streams), static_cast<long long>(interval), phase.c_str(),
              static_cast<long long>(tokens));
  std::printf("%-6s %-7s %8s %8s %8s %8s %8s\n", "round", "path", "tokens", "p50 us", "p90 us",
              "p99 us", "max us");
  std::vector<double> added_p50, added_p99, cpu_us_per_token;
  for (int r = 0; r < rounds; ++r) {
    const auto d = measure(false, r);
    const int64_t cpu_before = ProcessCpuNanos(router.first);
    const auto routed = measure(true, r);
    cpu_us_per_token.push_back(static_cast<double>(ProcessCpuNanos(router.first) - cpu_before) /
                               1000.0 / static_cast<double>(std::max<size_t>(1, routed.size())));
    for (const auto& [name, v] : {std::pair{"direct", &d}, std::pair{"router", &routed}}) {
      std::printf("%-6d %-7s %8zu %8.0f %8.0f %8.0f %8.0f\n", r, name, v->size(),
                  Percentile(*v, 0.5), Percentile(*v, 0.9), Percentile(*v, 0.99),
                  Percentile(*v, 1.0));
    }
    added_p50.push_back(Percentile(routed, 0.5) - Percentile(d, 0.5));
    added_p99.push_back(Percentile(routed, 0.99) - Percentile(d, 0.99));
  }
  kill(router.first, SIGTERM);
  waitpid(router.first, nullptr, 0);
  server->Shutdown(std::chrono::system_clock::now());
  std::sort(added_p50.begin(), added_p50.end());
  std::sort(added_p99.begin(), added_p99.end());
  std::sort(cpu_us_per_token.begin(), cpu_us_per_token.end());
  std::printf(
      "router adds per token (median of %lld rounds): p50 %.0f us, p99 %.0f us; router CPU "
      "%.1f us per token\n",
      static_cast<long long>(rounds), added_p50[added_p50.size() / 2],
      added_p99[added_p99.size() / 2], cpu_us_per_token[cpu_us_per_token.size() / 2]);
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  TANDEM_ASSIGN_OR_RETURN(CliArgs args, CliArgs::Parse(argc, argv, {}));
  const auto& words = args.positional();
  if (words.size() == 1 && words[0] == "fake-workers") return ServeFakes(args);
  if (words.size() == 1 && words[0] == "latency") return RunLatency(args);
  if (words.size() == 1 && words[0] == "proxy") return ServeProxy(args);
  return absl::InvalidArgumentError(
      "usage: router-overhead-bench fake-workers --listen HOST:PORT [--valid-ids V] | "
      "latency --tandem BIN --model DIR [--streams N --tokens T --rounds R --phase aligned|spread]");
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  absl::Status s = tandem::bench::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "router-overhead-bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
