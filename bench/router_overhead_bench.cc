// What the router adds to every streamed token, measured against fake workers.
//
//   router-overhead-bench fake-workers --listen HOST:PORT [--valid-ids V] [--token-interval-us N]
//       Serves PrefillWorker and DecodeWorker with no model: the first token comes back at once,
//       decode streams one token per message. Each token id is the send time in microseconds
//       (steady clock, mod 2^31) so a client on the same machine can tell how long the token
//       took to reach it; --valid-ids V sends ids below V instead (for a router that detokenizes).
//   router-overhead-bench latency --router HOST:PORT --worker HOST:PORT [--streams N]
//       [--tokens T] [--rounds R]
//       Opens N concurrent streams of T tokens through the router and, for comparison, straight
//       from the fake decode worker, and prints the per-token delivery latency of both
//       (p50/p90/p99) and the difference: the router's added latency per streamed token.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/server_stream.h"
#include "common/util/cli_args.h"
#include "common/util/status_macros.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::bench {
namespace {

int32_t NowStamp() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  return static_cast<int32_t>(us & 0x7fffffff);
}

// Microseconds from a stamp to now (stamps wrap every ~36 minutes).
int64_t Since(int32_t stamp) { return (static_cast<int64_t>(NowStamp()) - stamp) & 0x7fffffff; }

class FakePrefill final : public tandem::v1::PrefillWorker::CallbackService {
 public:
  explicit FakePrefill(int32_t valid_ids) : valid_ids_(valid_ids) {}
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const tandem::v1::PrefillRequest*,
                                    tandem::v1::PrefillResponse* response) override {
    response->set_first_token(valid_ids_ > 0 ? 1 : NowStamp());
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const int32_t valid_ids_;
};

// Streams the tokens a DecodeRequest still needs, one per message: as fast as gRPC takes them,
// or one every `interval` from a pacing thread (so latency is measured without a backlog).
class FakeStream final : public grpc::ServerWriteReactor<tandem::v1::DecodeResponse> {
 public:
  FakeStream(int remaining, int32_t valid_ids, std::chrono::microseconds interval)
      : remaining_(remaining), valid_ids_(valid_ids), paced_(this) {
    if (interval.count() == 0) {
      Next();
      return;
    }
    pacer_ = std::thread([this, interval] {
      auto next = std::chrono::steady_clock::now();
      while (remaining_ > 0 && !cancelled_) {
        next += interval;
        std::this_thread::sleep_until(next);
        paced_.Push(Token());
      }
      paced_.End(grpc::Status::OK);
    });
  }
  void OnWriteDone(bool ok) override {
    if (pacer_.joinable()) {
      paced_.WriteDone(ok);
      return;
    }
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client gone"));
      return;
    }
    Next();
  }
  void OnCancel() override { cancelled_ = true; }
  void OnDone() override {
    if (pacer_.joinable()) pacer_.join();
    delete this;
  }

 private:
  tandem::v1::DecodeResponse Token() {
    tandem::v1::DecodeResponse m;
    m.add_token_ids(valid_ids_ > 0 ? 1 + (remaining_ % (valid_ids_ - 1)) : NowStamp());
    if (--remaining_ == 0) m.set_finish_reason(tandem::v1::FINISH_REASON_LENGTH);
    return m;
  }
  void Next() {
    if (remaining_ == 0) {
      Finish(grpc::Status::OK);
      return;
    }
    message_ = Token();
    StartWrite(&message_);
  }

  std::atomic<int> remaining_;
  const int32_t valid_ids_;
  std::atomic<bool> cancelled_{false};
  tandem::v1::DecodeResponse message_;
  rpc::ServerStream<tandem::v1::DecodeResponse> paced_;
  std::thread pacer_;
};

class FakeDecode final : public tandem::v1::DecodeWorker::CallbackService {
 public:
  FakeDecode(int32_t valid_ids, std::chrono::microseconds interval)
      : valid_ids_(valid_ids), interval_(interval) {}
  grpc::ServerWriteReactor<tandem::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext*, const tandem::v1::DecodeRequest* request) override {
    const int remaining =
        std::max(0, request->sampling().max_tokens() - request->completion_tokens());
    return new FakeStream(remaining, valid_ids_, interval_);
  }

 private:
  const int32_t valid_ids_;
  const std::chrono::microseconds interval_;
};

absl::Status ServeFakes(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(std::string listen, args.String("listen"));
  TANDEM_ASSIGN_OR_RETURN(int64_t valid_ids, args.IntOr("valid-ids", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t interval, args.IntOr("token-interval-us", 0));
  FakePrefill prefill(static_cast<int32_t>(valid_ids));
  FakeDecode decode(static_cast<int32_t>(valid_ids), std::chrono::microseconds(interval));
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

const google::protobuf::RepeatedField<int32_t>& TokensOf(const tandem::v1::GenerateResponse& m) {
  return m.chunk().token_ids();
}
const google::protobuf::RepeatedField<int32_t>& TokensOf(const tandem::v1::DecodeResponse& m) {
  return m.token_ids();
}

// Per-token latencies (us) of `streams` concurrent streams opened by `open(i, context)`, each
// returning a reader of messages with token ids.
template <typename Reader, typename Message, typename Open>
std::vector<int64_t> Measure(int streams, Open open) {
  std::vector<std::vector<int64_t>> per(streams);
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      std::unique_ptr<Reader> reader = open(context);
      Message m;
      while (reader->Read(&m)) {
        for (int32_t stamp : TokensOf(m)) per[i].push_back(Since(stamp));
      }
      reader->Finish();
    });
  }
  for (auto& t : threads) t.join();
  std::vector<int64_t> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  return all;
}

double Percentile(const std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  return static_cast<double>(sorted[static_cast<size_t>(p * (sorted.size() - 1))]);
}

absl::Status RunLatency(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(std::string router, args.String("router"));
  TANDEM_ASSIGN_OR_RETURN(std::string worker, args.String("worker"));
  TANDEM_ASSIGN_OR_RETURN(int64_t streams, args.IntOr("streams", 16));
  TANDEM_ASSIGN_OR_RETURN(int64_t tokens, args.IntOr("tokens", 500));
  TANDEM_ASSIGN_OR_RETURN(int64_t rounds, args.IntOr("rounds", 3));
  auto inference = tandem::v1::Inference::NewStub(
      grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  auto decode = tandem::v1::DecodeWorker::NewStub(
      grpc::CreateChannel(worker, grpc::InsecureChannelCredentials()));
  std::printf("%-8s %-8s %10s %10s %10s %10s\n", "round", "path", "tokens", "p50 us", "p90 us",
              "p99 us");
  std::vector<double> added_p50, added_p99;
  for (int r = 0; r < rounds; ++r) {
    const auto direct =
        Measure<grpc::ClientReader<tandem::v1::DecodeResponse>, tandem::v1::DecodeResponse>(
            static_cast<int>(streams), [&](grpc::ClientContext& c) {
              tandem::v1::DecodeRequest req;
              req.add_token_ids(1);
              req.mutable_sampling()->set_max_tokens(static_cast<int>(tokens));
              return decode->Decode(&c, req);
            });
    const auto routed =
        Measure<grpc::ClientReader<tandem::v1::GenerateResponse>, tandem::v1::GenerateResponse>(
            static_cast<int>(streams), [&](grpc::ClientContext& c) {
              tandem::v1::GenerateRequest req;
              req.add_prompt_token_ids(1);
              req.mutable_sampling()->set_max_tokens(static_cast<int>(tokens));
              req.mutable_sampling()->set_ignore_eos(true);
              return inference->Generate(&c, req);
            });
    for (const auto& [name, v] : {std::pair{"direct", &direct}, std::pair{"router", &routed}}) {
      std::printf("%-8d %-8s %10zu %10.0f %10.0f %10.0f\n", r, name, v->size(),
                  Percentile(*v, 0.5), Percentile(*v, 0.9), Percentile(*v, 0.99));
    }
    added_p50.push_back(Percentile(routed, 0.5) - Percentile(direct, 0.5));
    added_p99.push_back(Percentile(routed, 0.99) - Percentile(direct, 0.99));
  }
  std::sort(added_p50.begin(), added_p50.end());
  std::sort(added_p99.begin(), added_p99.end());
  std::printf("router adds per token (median of %lld rounds): p50 %.0f us, p99 %.0f us\n",
              static_cast<long long>(rounds), added_p50[added_p50.size() / 2],
              added_p99[added_p99.size() / 2]);
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  TANDEM_ASSIGN_OR_RETURN(CliArgs args, CliArgs::Parse(argc, argv, {}));
  const auto& words = args.positional();
  if (words.size() == 1 && words[0] == "fake-workers") return ServeFakes(args);
  if (words.size() == 1 && words[0] == "latency") return RunLatency(args);
  return absl::InvalidArgumentError(
      "usage: router-overhead-bench fake-workers --listen HOST:PORT [--valid-ids V] | "
      "latency --router HOST:PORT --worker HOST:PORT [--streams N --tokens T --rounds R]");
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
