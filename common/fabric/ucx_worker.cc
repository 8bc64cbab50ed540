#include "common/fabric/ucx_worker.h"

#include <poll.h>
#include <ucs/debug/log_def.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/log.h"

namespace tandem::fabric {
namespace {

// Set while this thread builds an endpoint that may fail as expected (UcxWorker's probe of
// peer error handling): UCX logs the failure as an error, which is then dropped.
thread_local bool expecting_failure = false;

// UCX's log lines (errors and warnings; UCX_LOG_LEVEL sets how much) go through Tandem's log,
// on stderr in its format, instead of UCX's own printer on stdout.
ucs_log_func_rc_t LogThroughTandem(const char* file, unsigned line, const char* /*function*/,
                                   ucs_log_level_t level, const ucs_log_component_config_t*,
                                   const char* format, va_list ap) {
  if (expecting_failure && level <= UCS_LOG_LEVEL_ERROR && level != UCS_LOG_LEVEL_FATAL) {
    return UCS_LOG_FUNC_RC_STOP;
  }
  char text[1024];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof text, format, copy);
  va_end(copy);
  const char* name = file != nullptr ? file : "";
  if (const char* slash = std::strrchr(name, '/')) name = slash + 1;
  Log(level <= UCS_LOG_LEVEL_ERROR  ? LogLevel::kError
      : level == UCS_LOG_LEVEL_WARN ? LogLevel::kWarning
                                    : LogLevel::kInfo,
      "ucx", absl::StrCat(text, " (UCX ", name, ":", line, ")"));
  return level == UCS_LOG_LEVEL_FATAL ? UCS_LOG_FUNC_RC_CONTINUE : UCS_LOG_FUNC_RC_STOP;
}

// Builds an endpoint whose failure is expected and handled by the caller.
ucs_status_t CreateEndpointQuietly(ucp_worker_h worker, const ucp_ep_params_t& params,
                                   ucp_ep_h* ep) {
  expecting_failure = true;
  const ucs_status_t s = ucp_ep_create(worker, &params, ep);
  expecting_failure = false;
  return s;
}

absl::Status UcxError(const char* what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX: ", what, ": ", ucs_status_string(status)));
}

// How long the thread keeps progressing after the last event before it sleeps: a burst of
// transfers then pays for one wakeup, not one per message. A time, not a count: one progress
// call costs a system call on TCP and a few loads on shared memory.
// Short: on a host with few cores a spinning worker takes the time its peer or the caller
// needs (docs/benchmarks.md measured 0 to 1,000 µs on two vCPUs: none better than another).
constexpr std::chrono::microseconds kSpinBeforeSleep{50};
// A yield that gave the core away this long means a computing thread shares it.
constexpr std::chrono::microseconds kYieldTooLong{500};
// How long the thread then sleeps as soon as it is idle, before it tries spinning again.
constexpr std::chrono::milliseconds kNoSpinAfterLongYield{100};
// The sleep is bounded so that a missed wakeup costs latency, never liveness.
constexpr int kSleepMs = 100;

}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(UcxWorkerOptions options) {
  static std::once_flag log_once;
  std::call_once(log_once, [] { ucs_log_push_handler(&LogThroughTandem); });
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  w->handlers_ = std::move(options.handlers);
  w->on_endpoint_error_ = std::move(options.on_endpoint_error);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxError("reading its configuration", s);
  if (!options.transports.empty()) {
    s = ucp_config_modify(config, "TLS", options.transports.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return UcxError("transports", s);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = options.name.c_str();
  s = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (s != UCS_OK) return UcxError("ucp_init", s);

  ucp_worker_params_t worker{};
  worker.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker.thread_mode = UCS_THREAD_MODE_SINGLE;  // only its thread calls it
  s = ucp_worker_create(w->context_, &worker, &w->worker_);
  if (s != UCS_OK) return UcxError("ucp_worker_create", s);
  s = ucp_worker_get_efd(w->worker_, &w->event_fd_);
  if (s != UCS_OK) return UcxError("ucp_worker_get_efd", s);
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  s = ucp_worker_get_address(w->worker_, &address, &address_length);
  if (s != UCS_OK) return UcxError("ucp_worker_get_address", s);
  w->address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(w->worker_, address);
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  s = ucp_worker_query(w->worker_, &attr);
  if (s != UCS_OK) return UcxError("ucp_worker_query", s);
  w->max_am_header_ = attr.max_am_header;
  const char* tls = std::getenv("UCX_TLS");
  w->transports_ = !options.transports.empty()      ? options.transports
                   : tls != nullptr && *tls != '\0' ? tls
                                                    : "all";

  for (auto& [id, handler] : w->handlers_) {
    ucp_am_handler_param_t h{};
    h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    h.id = id;
    h.flags = UCP_AM_FLAG_WHOLE_MSG;
    h.arg = &handler;
    h.cb = +[](void* arg, const void* header, size_t header_length, void* data, size_t length,
               const ucp_am_recv_param_t* param) {
      return (*static_cast<AmHandler*>(arg))(header, header_length, data, length, param);
    };
    s = ucp_worker_set_am_recv_handler(w->worker_, &h);
    if (s != UCS_OK) return UcxError("ucp_worker_set_am_recv_handler", s);
  }
  return w;
}

void UcxWorker::Start() {
  thread_ = std::thread([this] { Run(); });
}

UcxWorker::~UcxWorker() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    ucp_worker_signal(worker_);
    thread_.join();
  }
  for (ucp_mem_h memh : registered_) ucp_mem_unmap(context_, memh);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::StatusOr<ucp_mem_h> UcxWorker::Register(void* data, size_t length) {
  ucp_mem_map_params_t map{};
  map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  map.address = data;
  map.length = length;
  ucp_mem_h memh = nullptr;
  const ucs_status_t s = ucp_mem_map(context_, &map, &memh);
  if (s != UCS_OK) return UcxError("registering memory", s);
  registered_.push_back(memh);
  return memh;
}

void UcxWorker::Post(absl::AnyInvocable<void()> task) {
  if (std::this_thread::get_id() == thread_id_) {  // a handler's follow-up: no wakeup needed
    local_.push_back(std::move(task));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    posted_.push_back(std::move(task));
  }
  ucp_worker_signal(worker_);  // thread-safe, unlike the rest of the worker
}

void UcxWorker::RunAt(std::chrono::steady_clock::time_point when, absl::AnyInvocable<void()> task) {
  timers_.emplace(when, std::move(task));
}

bool UcxWorker::RunPosted() {
  std::vector<absl::AnyInvocable<void()>> tasks;
  tasks.swap(local_);
  if (!timers_.empty()) {
    const auto now = std::chrono::steady_clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      tasks.push_back(std::move(timers_.begin()->second));
      timers_.erase(timers_.begin());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (tasks.empty()) {
      tasks.swap(posted_);
    } else {
      for (auto& task : posted_) tasks.push_back(std::move(task));
      posted_.clear();
    }
  }
  for (auto& task : tasks) task();  // outside the lock: tasks post more
  return !tasks.empty();
}

void UcxWorker::Run() {
  thread_id_ = std::this_thread::get_id();
  auto last_busy = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point no_spin_until{};
  while (true) {
    bool busy = ucp_worker_progress(worker_) != 0;
    busy |= RunPosted();
    ReapCloses();
    if (busy) {
      last_busy = std::chrono::steady_clock::now();
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ && posted_.empty()) break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_busy < kSpinBeforeSleep && now >= no_spin_until) {
      // Yields between polls: the peer this thread waits for may need this very core (a busy
      // node's workers share cores), and a spin that keeps it made UCX's shared-memory
      // transfers between processes 10x slower (docs/benchmarks.md). A yield that took long
      // ran a thread that computes (an engine on this core), which gives the core back only
      // at the end of its time slice: then sleep at once for a while instead, so that each
      // event wakes this thread (preempting that one) rather than waiting a slice.
      std::this_thread::yield();
      const auto yielded = std::chrono::steady_clock::now();
      if (yielded - now < kYieldTooLong) continue;
      no_spin_until = yielded + kNoSpinAfterLongYield;
    }
    last_busy = std::chrono::steady_clock::now();
    const ucs_status_t armed = ucp_worker_arm(worker_);
    if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress them
    int sleep_ms = kSleepMs;
    if (!timers_.empty()) {
      const auto until = timers_.begin()->first - std::chrono::steady_clock::now();
      sleep_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::ceil<std::chrono::milliseconds>(until).count(), 0, kSleepMs));
    }
    pollfd p{.fd = event_fd_, .events = POLLIN, .revents = 0};
    poll(&p, 1, sleep_ms);
  }
  // Stopping: the timers run now (what they cancel is closed below all the same).
  for (auto& [when, task] : timers_) local_.push_back(std::move(task));
  timers_.clear();
  RunPosted();
  for (auto& [address, ep] : endpoints_) Close(ep);
  endpoints_.clear();
  endpoints_open_ = 0;
  // Forced closes complete without the peer; progress until they have.
  while (!closing_.empty()) {
    ucp_worker_progress(worker_);
    ReapCloses();
  }
  RunPosted();  // what the closes completed may have posted
}

bool UcxWorker::detects_peer_failures() {
  if (!peer_failures_known_) {
    // Whether an endpoint with peer error handling can be built: one to this worker itself
    // (UCX 1.13's shared-memory transports cannot build one anywhere, and log an error).
    ucp_ep_params_t probe{};
    probe.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    probe.address = reinterpret_cast<const ucp_address_t*>(address_.data());
    probe.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ucp_ep_h ep = nullptr;
    peer_failures_ = CreateEndpointQuietly(worker_, probe, &ep) == UCS_OK;
    peer_failures_known_ = true;
    if (ep != nullptr) Close(ep);
    if (!peer_failures_) WarnNoPeerFailures();
  }
  return peer_failures_;
}

void UcxWorker::WarnNoPeerFailures() const {
  Log(LogLevel::kWarning, "ucx",
      "these UCX transports cannot detect a failed peer (UCX_TLS=" + transports_ +
          "): a transfer to a peer that died waits for its deadline");
}

void UcxWorker::ReapCloses() {
  for (auto it = closing_.begin(); it != closing_.end();) {
    if (ucp_request_check_status(*it) == UCS_INPROGRESS) {
      ++it;
    } else {
      ucp_request_free(*it);
      it = closing_.erase(it);
    }
  }
}

void UcxWorker::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t /*status*/) {
  auto* self = static_cast<UcxWorker*>(arg);
  // Outstanding requests have completed with the error; forget the endpoint so that the next
  // use builds a new one. Closed after this callback returns, as UCX requires.
  std::string address;
  for (auto it = self->endpoints_.begin(); it != self->endpoints_.end(); ++it) {
    if (it->second == ep) {
      address = it->first;
      self->endpoints_.erase(it);
      self->endpoints_open_ = static_cast<int64_t>(self->endpoints_.size());
      break;
    }
  }
  self->Post([self, ep] { self->Close(ep); });
  if (!address.empty() && self->on_endpoint_error_) self->on_endpoint_error_(address);
}

absl::StatusOr<ucp_ep_h> UcxWorker::Endpoint(const std::string& address) {
  if (auto it = endpoints_.find(address); it != endpoints_.end()) return it->second;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = peer_failures_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = &UcxWorker::OnEndpointError;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t s = peer_failures_ && !peer_failures_known_
                       ? CreateEndpointQuietly(worker_, params, &ep)
                       : ucp_ep_create(worker_, &params, &ep);
  if (s != UCS_OK && peer_failures_) {
    // UCX 1.13's shared-memory transports cannot tell a peer failed: without that, a dead peer
    // costs the caller's deadline, after which the endpoint is closed all the same.
    peer_failures_ = false;
    peer_failures_known_ = true;
    WarnNoPeerFailures();
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = ucp_ep_create(worker_, &params, &ep);
  }
  if (s != UCS_OK) return UcxError("ucp_ep_create", s);
  peer_failures_known_ = true;
  endpoints_.emplace(address, ep);
  endpoints_open_ = static_cast<int64_t>(endpoints_.size());
  ++endpoints_created_;
  return ep;
}

void UcxWorker::DropEndpoint(const std::string& address) {
  auto it = endpoints_.find(address);
  if (it == endpoints_.end()) return;
  ucp_ep_h ep = it->second;
  endpoints_.erase(it);
  endpoints_open_ = static_cast<int64_t>(endpoints_.size());
  Close(ep);
}

void UcxWorker::Close(ucp_ep_h ep) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing_.push_back(request);
}

}  // namespace tandem::fabric
