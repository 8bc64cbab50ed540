// tandem generate: one streamed completion from a router, text to stdout as it arrives.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/engine_proto.h"
#include "common/rpc/status.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tools/tandem/commands.h"

namespace tandem::cli {
namespace {

absl::StatusOr<tandem::v1::GenerateRequest> BuildRequest(const CliArgs& args) {
  tandem::v1::GenerateRequest r;
  if (args.Has("prompt")) r.set_prompt(*args.String("prompt"));
  if (args.Has("tokens")) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, args.IntList("tokens"));
    for (int32_t id : ids) r.add_prompt_token_ids(id);
  }
  tandem::v1::SamplingParams* s = r.mutable_sampling();
  TANDEM_ASSIGN_OR_RETURN(int64_t max_tokens, args.IntOr("max-tokens", 64));
  TANDEM_ASSIGN_OR_RETURN(double temperature, args.DoubleOr("temperature", 0));
  TANDEM_ASSIGN_OR_RETURN(double top_p, args.DoubleOr("top-p", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t top_k, args.IntOr("top-k", 0));
  TANDEM_ASSIGN_OR_RETURN(int64_t seed, args.IntOr("seed", 0));
  if (max_tokens > INT32_MAX || max_tokens < INT32_MIN || top_k > INT32_MAX || top_k < INT32_MIN) {
    return absl::InvalidArgumentError("--max-tokens or --top-k out of range");
  }
  s->set_max_tokens(static_cast<int32_t>(max_tokens));
  s->set_temperature(static_cast<float>(temperature));
  s->set_top_p(static_cast<float>(top_p));
  s->set_top_k(static_cast<int32_t>(top_k));
  s->set_seed(static_cast<uint64_t>(seed));
  for (const std::string& stop : args.All("stop")) s->add_stop(stop);
  s->set_ignore_eos(args.Has("ignore-eos"));
  r.set_request_id(args.StringOr("request-id", ""));
  return r;
}

// TLS with `--ca-file` (the server is verified by the host name in --addr), else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> Credentials(const CliArgs& args) {
  if (!args.Has("ca-file")) return grpc::InsecureChannelCredentials();
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("ca-file"));
  absl::StatusOr<std::string> ca = ReadFileToString(path);
  if (!ca.ok())
    return absl::InvalidArgumentError(absl::StrCat("--ca-file: ", ca.status().message()));
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = *std::move(ca);
  return grpc::SslCredentials(o);
}

}  // namespace

absl::Status RunGenerate(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(
      {"addr", "prompt", "tokens", "max-tokens", "temperature", "top-p", "top-k", "seed", "stop",
       "ignore-eos", "print-ids", "request-id", "timeout", "wait-ready", "ca-file", "api-key"}));
  TANDEM_ASSIGN_OR_RETURN(std::string addr, args.String("addr"));
  TANDEM_ASSIGN_OR_RETURN(tandem::v1::GenerateRequest request, BuildRequest(args));
  TANDEM_ASSIGN_OR_RETURN(double timeout, args.DoubleOr("timeout", 600));
  TANDEM_ASSIGN_OR_RETURN(auto credentials, Credentials(args));
  auto stub = tandem::v1::Inference::NewStub(grpc::CreateChannel(addr, credentials));
  grpc::ClientContext context;
  if (args.Has("api-key")) {
    TANDEM_ASSIGN_OR_RETURN(std::string key, args.String("api-key"));
    context.AddMetadata("authorization", "Bearer " + key);
  }
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
  // --wait-ready: wait (up to the deadline) for the server to come up instead of failing fast.
  context.set_wait_for_ready(args.Has("wait-ready"));
  auto reader = stub->Generate(&context, request);
  tandem::v1::GenerateResponse msg;
  std::vector<int32_t> ids;
  tandem::v1::Complete complete;
  while (reader->Read(&msg)) {
    if (msg.has_chunk()) {
      ids.insert(ids.end(), msg.chunk().token_ids().begin(), msg.chunk().token_ids().end());
      std::fputs(msg.chunk().text().c_str(), stdout);
      std::fflush(stdout);
    } else if (msg.has_complete()) {
      complete = msg.complete();
    }
  }
  const grpc::Status status = reader->Finish();
  std::fputs("\n", stdout);
  std::fflush(stdout);  // before the summary on stderr
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  if (args.Has("print-ids")) std::printf("%s\n", absl::StrJoin(ids, ",").c_str());
  const auto& u = complete.usage();
  const auto& t = complete.timings();
  const double decode_rate =
      t.decode() > 0 && u.completion_tokens() > 1 ? (u.completion_tokens() - 1) / t.decode() : 0;
  std::fprintf(stderr,
               "generate: finish %s; prompt %d tokens (%d cached), %d generated; queue %.1f ms, "
               "prefill %.1f ms, kv transfer %.1f ms, first token %.1f ms, decode %.1f tok/s\n",
               rpc::FinishReasonName(complete.finish_reason()), u.prompt_tokens(), u.cached_prompt_tokens(),
               u.completion_tokens(), t.queue() * 1e3, t.prefill() * 1e3, t.kv_transfer() * 1e3,
               t.time_to_first_token() * 1e3, decode_rate);
  return absl::OkStatus();
}

}  // namespace tandem::cli
