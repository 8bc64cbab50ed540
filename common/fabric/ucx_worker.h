// One UCX context and worker, driven by a thread of its own: the KV fabric's endpoint in a
// cache-store shard (cache_store/ucx_data_plane.h) and in a worker (common/store/ucx_client.h).
//
// Threads: every UCX call on the worker runs on its thread, which progresses the worker, runs
// the active-message handlers, and runs the tasks other threads Post. Between bursts it sleeps
// on the worker's event descriptor (UCX wakeup), so an idle worker costs no CPU. The handlers
// and tasks must not block.
//
// Endpoints are cached by the remote worker's address, created on first use with peer error
// handling: when a peer fails, UCX completes its outstanding requests with an error, the
// endpoint is closed, and the next use creates a new one.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::fabric {

// An active-message handler (ucp_am_recv_callback_t's arguments); runs on the worker's thread.
// Return UCS_OK, or UCS_INPROGRESS after keeping `data` (UCP_AM_RECV_ATTR_FLAG_DATA or _RNDV)
// to receive or release it later on the same thread.
using AmHandler = std::function<ucs_status_t(const void* header, size_t header_length, void* data,
                                             size_t length, const ucp_am_recv_param_t* param)>;

struct UcxWorkerOptions {
  std::string name = "tandem";  // in UCX's own logs
  // The transports UCX may use ("tcp,self", UCX_TLS's syntax); empty: UCX_TLS, else all.
  std::string transports;
  std::vector<std::pair<unsigned, AmHandler>> handlers;  // by active-message id
  // Told, on the worker's thread, the address of a peer whose endpoint failed (after UCX
  // completed its outstanding requests with the error).
  std::function<void(const std::string& address)> on_endpoint_error = nullptr;
};

class UcxWorker {
 public:
  // Unavailable when UCX cannot start (no transport UCX_TLS allows, for instance). The thread
  // starts with Start, so that what the handlers use can be set up (and memory registered)
  // before any of it runs.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(UcxWorkerOptions options);
  void Start();
  // Closes the endpoints (forcibly: outstanding requests complete with an error), runs the
  // tasks still posted, and stops the thread.
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // The worker's address, for a peer to connect to (ucp_worker_get_address).
  const std::string& address() const { return address_; }
  // The transports UCX selected for this process (UCX_TLS, "tcp,sm,self" style), for logs.
  const std::string& transports() const { return transports_; }
  ucp_context_h context() const { return context_; }
  // The largest active-message header the transports carry (ucp_worker_query).
  size_t max_am_header() const { return max_am_header_; }
  // Registers [data, data + length) with UCX, once, so that transfers in and out of it need no
  // registration of their own; unregistered when the worker is destroyed, after its thread
  // stopped. Before Start.
  absl::StatusOr<ucp_mem_h> Register(void* data, size_t length);

  // Runs `task` on the worker's thread soon. Thread-safe; tasks run in posting order. Tasks
  // posted while the worker is being destroyed run before it stops.
  void Post(absl::AnyInvocable<void()> task);

  // On the worker's thread only.
  ucp_worker_h worker() const { return worker_; }
  // The endpoint to the worker at `address`, created on first use.
  absl::StatusOr<ucp_ep_h> Endpoint(const std::string& address);
  // Closes the endpoint to `address` forcibly, if there is one: its outstanding requests
  // complete with UCS_ERR_CANCELED; the next Endpoint creates a new one.
  void DropEndpoint(const std::string& address);
  // Closes `ep` forcibly: an endpoint UCX made for a peer that connected (an active message's
  // reply endpoint), whose requests then complete with an error. Nothing may use `ep` after.
  void CloseEndpoint(ucp_ep_h ep) { Close(ep); }
  // Runs `task` on the worker's thread once `when` has come (within a few milliseconds), or
  // when the worker stops, whichever is first. On the worker's thread only.
  void RunAt(std::chrono::steady_clock::time_point when, absl::AnyInvocable<void()> task);
  // Whether the transports tell this worker when a peer fails (false with UCX 1.13's
  // shared-memory ones): without it, a request to a dead or stalled peer never completes, not
  // even when its endpoint is closed, so it must not refer to memory its caller frees, nor
  // hold what others wait for.
  bool detects_peer_failures();
  // Endpoints open now (to peers this worker connected to), and created since start (a rebuilt
  // endpoint counts again). Thread-safe.
  int64_t endpoints_open() const { return endpoints_open_.load(std::memory_order_relaxed); }
  int64_t endpoints_created() const { return endpoints_created_.load(std::memory_order_relaxed); }

 private:
  UcxWorker() = default;
  void Run();
  // Runs what was posted, and the timers that are due; whether there was anything.
  bool RunPosted();
  void Close(ucp_ep_h ep);
  void ReapCloses();  // frees the closes that completed
  void WarnNoPeerFailures() const;
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string address_;
  std::string transports_;
  size_t max_am_header_ = 0;
  std::vector<std::pair<unsigned, AmHandler>> handlers_;  // stable: UCX holds pointers to them
  std::function<void(const std::string&)> on_endpoint_error_;

  // The worker thread's own state.
  std::atomic<std::thread::id> thread_id_{};
  std::vector<absl::AnyInvocable<void()>> local_;  // posted by the thread itself
  std::multimap<std::chrono::steady_clock::time_point, absl::AnyInvocable<void()>> timers_;
  absl::flat_hash_map<std::string, ucp_ep_h> endpoints_;
  std::atomic<int64_t> endpoints_open_{0};  // endpoints_.size(), for other threads
  std::atomic<int64_t> endpoints_created_{0};
  std::vector<ucs_status_ptr_t> closing_;  // endpoint closes not yet complete
  bool peer_failures_ = true;          // whether the transports detect failed peers (tried first)
  bool peer_failures_known_ = false;   // an endpoint or a probe told
  std::vector<ucp_mem_h> registered_;  // before the thread starts using them

  absl::Mutex mu_;
  std::vector<absl::AnyInvocable<void()>> posted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts once the rest is built
};

// Destroys `worker`, stopping its thread, while `worker` still points to it: for an owner whose
// handlers and tasks reach the worker through that pointer until the thread has stopped
// (unique_ptr::reset nulls it first). Then nulls it.
inline void DestroyWorker(std::unique_ptr<UcxWorker>& worker) {
  delete worker.get();
  static_cast<void>(worker.release());
}

}  // namespace tandem::fabric
