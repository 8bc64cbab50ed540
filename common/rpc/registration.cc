#include "common/rpc/registration.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/util/log.h"

namespace tandem::rpc {
namespace {

std::chrono::system_clock::time_point In(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

WorkerRegistration::WorkerRegistration(const std::string& router_address,
                                       tandem::v1::RegisterRequest request, LoadFn load,
                                       AcceptedFn accepted,
                                       std::shared_ptr<grpc::ChannelCredentials> credentials)
    : stub_(tandem::v1::Registry::NewStub(grpc::CreateChannel(
          router_address,
          credentials != nullptr ? credentials : grpc::InsecureChannelCredentials()))),
      request_(std::move(request)),
      load_(std::move(load)),
      accepted_(std::move(accepted)) {
  thread_ = std::thread([this] { Run(); });
}

WorkerRegistration::~WorkerRegistration() {
  stop_.Notify();
  thread_.join();
}

std::string WorkerRegistration::Register(double* interval_seconds) {
  double backoff = 0.1;
  while (!stop_.HasBeenNotified()) {
    grpc::ClientContext context;
    context.set_deadline(In(5));
    tandem::v1::RegisterResponse response;
    const grpc::Status s = stub_->Register(&context, request_, &response);
    if (s.ok()) {
      *interval_seconds = std::max(0.01, response.heartbeat_interval_seconds());
      Log(LogLevel::kInfo, "registration",
          absl::StrCat(request_.address(), " registered as ", response.worker_id()));
      if (!response.warning().empty()) {
        Log(LogLevel::kWarning, "registration", absl::StrCat("the router: ", response.warning()));
      }
      if (accepted_) accepted_(true);
      return response.worker_id();
    }
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && accepted_) accepted_(false);
    Log(LogLevel::kWarning, "registration",
        absl::StrCat(request_.address(), ": register failed (", s.error_message(), "); retrying"));
    stop_.WaitForNotificationWithTimeout(absl::Seconds(backoff));
    backoff = std::min(backoff * 2, 5.0);
  }
  return "";
}

void WorkerRegistration::Run() {
  double interval = 1;
  std::string id = Register(&interval);
  bool full = true;  // the router knows nothing of this worker's blocks yet
  while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(interval))) {
    tandem::v1::HeartbeatRequest request;
    request.set_worker_id(id);
    load_(request.mutable_load(), full);
    grpc::ClientContext context;
    context.set_deadline(In(std::max(1.0, interval)));
    tandem::v1::HeartbeatResponse response;
    const grpc::Status s = stub_->Heartbeat(&context, request, &response);
    // A lost heartbeat may have carried events the router never applied, and a router that
    // missed some asks to resync: either way the next one is a full snapshot.
    full = !s.ok() || response.resync();
    if (s.ok() && !response.known()) {
      id = Register(&interval);
      full = true;
    }
  }
}

}  // namespace tandem::rpc
