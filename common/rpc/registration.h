// A worker's membership in a router's registry (workers.proto, Registry): registers, then
// heartbeats its load every interval the router asks for, registering again whenever the
// router has forgotten it (a router restart). Runs on its own thread until destroyed.
#pragma once

#include <grpcpp/security/credentials.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "tandem/v1/workers.grpc.pb.h"

namespace tandem::rpc {

class WorkerRegistration {
 public:
  // Fills the load for one heartbeat (called on the registration thread). With `full`, the
  // block hashes are a full snapshot (set full_block_snapshot); otherwise the KV events since
  // the last call. `full` follows registering, a failed heartbeat and a router's resync.
  using LoadFn = std::function<void(tandem::v1::WorkerLoad* load, bool full)>;
  // Told the router's answer to each registration it decides (called on the registration
  // thread): true when it accepted the worker, false when it refused it (FAILED_PRECONDITION:
  // another model or KV layout). Unreachable routers are not reported.
  using AcceptedFn = std::function<void(bool accepted)>;

  // `credentials`: how to reach the router (null: plaintext).
  WorkerRegistration(const std::string& router_address, tandem::v1::RegisterRequest request,
                     LoadFn load, AcceptedFn accepted = nullptr,
                     std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~WorkerRegistration();
  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

 private:
  void Run();
  // Registers until it succeeds or the object is being destroyed; returns the worker id.
  std::string Register(double* interval_seconds);

  std::unique_ptr<tandem::v1::Registry::Stub> stub_;
  const tandem::v1::RegisterRequest request_;
  const LoadFn load_;
  const AcceptedFn accepted_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tandem::rpc
