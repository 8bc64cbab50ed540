#include "common/store/ucx_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fabric/kv_protocol.h"
#include "common/store/block_checksum.h"
#include "common/store/shm_mapping.h"
#include "common/util/log.h"

namespace tandem::store {
namespace {

using fabric::KvBlockRef;
using fabric::KvReplyHeader;
using fabric::KvRequestHeader;

}  // namespace

// One call's blocks, in messages. Shared by the caller and the worker thread's ops, requests
// and receives, so that whatever UCX completes late still writes into (or reads from) live
// memory.
struct UcxKvClient::Batch {
  struct Message {
    size_t first = 0;  // its regions: [first, first + count)
    size_t count = 0;
    int64_t bytes = 0;
    uint64_t request_id = 0;
    std::vector<uint8_t> header;    // KvRequestHeader and the KvBlockRefs
    std::vector<ucp_dt_iov_t> iov;  // a read's buffers, when there are several
    // A write's copy of its blocks, back to back: of several (UCX 1.13 sends an iovec through
    // its slow fragmenting protocols, a contiguous buffer with zero copy), or of any where the
    // endpoint cannot tell a dead peer (see UcxWorker::detects_peer_failures): UCX may then
    // hold a send for ever.
    std::string staging;
  };
  std::string address;
  uint64_t lease_id = 0;
  bool write = false;
  std::vector<ArenaRegion> regions;  // a write's `bytes` are the caller's, read until sent
  std::vector<Message> messages;
  // A read's blocks, each sized on the worker thread as its message arrives: the zero-fill of
  // std::string's resize then overlaps the messages still moving instead of delaying the first.
  std::vector<std::string> buffers;

  absl::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;     // the worker thread has sent (or failed) it all
  size_t ops_left ABSL_GUARDED_BY(mu) = 0;      // messages not yet answered or failed
  size_t caller_reads ABSL_GUARDED_BY(mu) = 0;  // sends UCX may still read the caller's bytes for
  std::vector<size_t> arrived ABSL_GUARDED_BY(mu);  // messages whose blocks are in, in order
  absl::Status status ABSL_GUARDED_BY(mu);          // the first failure
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return started && ops_left == 0 && caller_reads == 0;
  }

  // What UCX sends message `m` from: its staging copy, or the caller's bytes of its one block.
  std::pair<const void*, size_t> Source(size_t m) const {
    const Message& message = messages[m];
    if (!message.staging.empty()) return {message.staging.data(), message.staging.size()};
    return {regions[message.first].bytes.data(), regions[message.first].bytes.size()};
  }
  // Sizes message `m`'s buffers and points `param` at where its blocks are received: its one
  // buffer, or an iovec of them (UCX scatters a contiguous send into it). Returns the buffer and
  // count for UCX. Worker thread only.
  std::pair<void*, size_t> Destination(size_t m, ucp_request_param_t& param) {
    Message& message = messages[m];
    for (size_t i = message.first; i < message.first + message.count; ++i) {
      buffers[i].resize(static_cast<size_t>(regions[i].length));
    }
    if (message.count == 1) return {buffers[message.first].data(), buffers[message.first].size()};
    message.iov.clear();
    for (size_t i = message.first; i < message.first + message.count; ++i) {
      message.iov.push_back({buffers[i].data(), buffers[i].size()});
    }
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    return {message.iov.data(), message.iov.size()};
  }
};

namespace {

// A request's or a receive's completion context (UCX's C callbacks take one pointer).
struct Pending {
  UcxKvClient* client = nullptr;
  std::shared_ptr<void> batch;  // keeps the batch alive until UCX is done with it
  uint64_t request_id = 0;
  bool caller_memory = false;  // the send reads the caller's bytes
};

}  // namespace

absl::StatusOr<std::shared_ptr<UcxKvClient>> UcxKvClient::Shared() {
  static absl::Mutex mu(absl::kConstInit);
  static std::weak_ptr<UcxKvClient>* shared ABSL_GUARDED_BY(mu) = nullptr;
  absl::MutexLock lock(&mu);
  if (shared == nullptr) shared = new std::weak_ptr<UcxKvClient>();  // lives for the process
  if (std::shared_ptr<UcxKvClient> live = shared->lock()) return live;
  absl::StatusOr<std::shared_ptr<UcxKvClient>> client = Create("");
  if (client.ok()) *shared = *client;
  return client;
}

absl::StatusOr<std::shared_ptr<UcxKvClient>> UcxKvClient::Create(const std::string& transports) {
  std::shared_ptr<UcxKvClient> client(new UcxKvClient());
  UcxKvClient* self = client.get();
  fabric::UcxWorkerOptions options;
  options.name = "tandem-kv-client";
  options.transports = transports;
  options.handlers.emplace_back(
      fabric::kPutDone, [self](const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
        return self->OnReply(false, header, header_length, data, length, param);
      });
  options.handlers.emplace_back(
      fabric::kGetDone, [self](const void* header, size_t header_length, void* data, size_t length,
                               const ucp_am_recv_param_t* param) {
        return self->OnReply(true, header, header_length, data, length, param);
      });
  options.on_endpoint_error = [self](const std::string& address) {
    self->FailAll(address, absl::UnavailableError("cache store fabric: the shard went away"));
  };
  absl::StatusOr<std::unique_ptr<fabric::UcxWorker>> worker =
      fabric::UcxWorker::Create(std::move(options));
  if (!worker.ok()) return worker.status();
  client->worker_ = *std::move(worker);
  const size_t header = client->worker_->max_am_header();
  if (header < fabric::KvHeaderBytes(1)) {
    return absl::UnavailableError(absl::StrCat("UCX: the transports' headers hold ", header,
                                               " bytes, too few for one block's request"));
  }
  client->blocks_per_message_ = std::min<size_t>(
      fabric::kKvMaxBlocksPerMessage, (header - sizeof(KvRequestHeader)) / sizeof(KvBlockRef));
  client->worker_->Start();
  return client;
}

UcxKvClient::~UcxKvClient() {
  // Forced closes complete every request; the batches' callers are gone.
  fabric::DestroyWorker(worker_);
}

UcxKvClientStats UcxKvClient::Stats() const {
  return {.put_blocks = put_blocks_.load(),
          .get_blocks = get_blocks_.load(),
          .put_bytes = put_bytes_.load(),
          .get_bytes = get_bytes_.load(),
          .failed_batches = failed_batches_.load(),
          .endpoints = worker_->endpoints_open(),
          .endpoints_created = worker_->endpoints_created()};
}

void UcxKvClient::AddPath(const std::string& address) {
  absl::MutexLock lock(&paths_mu_);
  ++paths_[address];
}

void UcxKvClient::Connect(const std::string& address) {
  worker_->Post([this, address] {
    if (absl::StatusOr<ucp_ep_h> ep = worker_->Endpoint(address); !ep.ok()) {
      Log(LogLevel::kWarning, "cache-store-client", ep.status().ToString());
    }
  });
}

void UcxKvClient::RemovePath(const std::string& address) {
  {
    absl::MutexLock lock(&paths_mu_);
    auto it = paths_.find(address);
    if (it == paths_.end() || --it->second > 0) return;
    paths_.erase(it);
  }
  // No call of a path to it is in flight (a path outlives its calls). Closed unless a new path
  // to the same address began meanwhile.
  worker_->Post([this, address] {
    {
      absl::MutexLock lock(&paths_mu_);
      if (paths_.contains(address)) return;
    }
    worker_->DropEndpoint(address);
  });
}

absl::Status UcxKvClient::Write(const std::string& address, const LeaseGrant& lease,
                                std::span<const ArenaRegion> regions, Clock::time_point deadline,
                                const std::function<void()>& meanwhile) {
  return Run(address, lease, regions, {}, deadline, meanwhile, nullptr);
}

absl::Status UcxKvClient::Read(const std::string& address, const LeaseGrant& lease,
                               std::span<const ArenaRegion> regions, std::span<std::string> out,
                               Clock::time_point deadline, const Arrived& arrived) {
  return Run(address, lease, regions, out, deadline, nullptr, arrived);
}

absl::Status UcxKvClient::Run(const std::string& address, const LeaseGrant& lease,
                              std::span<const ArenaRegion> regions, std::span<std::string> out,
                              Clock::time_point deadline, const std::function<void()>& meanwhile,
                              const Arrived& arrived) {
  if (regions.empty()) return absl::OkStatus();
  auto batch = std::make_shared<Batch>();
  batch->address = address;
  batch->lease_id = lease.id;
  batch->write = out.empty();
  batch->regions.assign(regions.begin(), regions.end());
  // Runs of regions, each until kMessageBytes or the header's limit.
  for (size_t i = 0; i < regions.size(); ++i) {
    if (batch->messages.empty() || batch->messages.back().count == blocks_per_message_ ||
        batch->messages.back().bytes + regions[i].length > kMessageBytes) {
      batch->messages.push_back({.first = i});
    }
    batch->messages.back().count += 1;
    batch->messages.back().bytes += regions[i].length;
  }
  for (Batch::Message& m : batch->messages) {
    m.request_id = next_request_id_++;
    const KvRequestHeader h{.count = static_cast<uint32_t>(m.count),
                            .request_id = m.request_id,
                            .lease_id = lease.id,
                            .key = {lease.key[0], lease.key[1]}};
    m.header.resize(fabric::KvHeaderBytes(h.count));
    std::memcpy(m.header.data(), &h, sizeof h);
    for (size_t i = 0; i < m.count; ++i) {
      const ArenaRegion& r = regions[m.first + i];
      const KvBlockRef ref{.index = r.index, .offset = r.offset, .length = r.length};
      std::memcpy(m.header.data() + sizeof h + i * sizeof ref, &ref, sizeof ref);
    }
  }
  if (!batch->write) {
    batch->buffers.resize(regions.size());
  }
  {
    absl::MutexLock lock(&batch->mu);
    batch->ops_left = batch->messages.size();
  }
  worker_->Post([this, batch] { Start(batch); });
  if (meanwhile) meanwhile();

  absl::MutexLock lock(&batch->mu);
  size_t seen = 0;  // of batch->arrived
  const auto news = [&batch, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch->mu) {
    return batch->Done() || batch->arrived.size() > seen;
  };
  bool late = false;
  while (!batch->Done() || seen < batch->arrived.size()) {
    if (!late && !batch->mu.AwaitWithTimeout(absl::Condition(&news),
                                             absl::FromChrono(deadline - Clock::now()))) {
      // Late: close the endpoint, which completes every request on it with an error, and wait
      // for that (UCX guarantees it where it detects failed peers; elsewhere no send reads the
      // caller's bytes), so that no send reads the caller's buffers after this returns.
      late = true;
      batch->mu.Unlock();
      worker_->Post([this, address] {
        worker_->DropEndpoint(address);
        FailAll(address, absl::DeadlineExceededError("cache store fabric: transfer timed out"));
      });
      batch->mu.Lock();
    }
    if (late) batch->mu.Await(absl::Condition(&news));
    while (seen < batch->arrived.size()) {
      const Batch::Message& m = batch->messages[batch->arrived[seen++]];
      if (!arrived) continue;
      batch->mu.Unlock();  // UCX is done with these buffers
      arrived(m.first, std::span<const std::string>(batch->buffers).subspan(m.first, m.count));
      batch->mu.Lock();
    }
  }
  if (!batch->status.ok()) {
    ++failed_batches_;
    return batch->status;
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    (batch->write ? put_bytes_ : get_bytes_) += regions[i].length;
    if (!batch->write) out[i] = std::move(batch->buffers[i]);
  }
  (batch->write ? put_blocks_ : get_blocks_) += static_cast<int64_t>(regions.size());
  return absl::OkStatus();
}

void UcxKvClient::Start(const std::shared_ptr<Batch>& batch) {
  absl::StatusOr<ucp_ep_h> ep = worker_->Endpoint(batch->address);
  // A write sends a lone block from the caller's bytes where a failed peer is detected.
  const bool zero_copy = batch->write && worker_->detects_peer_failures();
  size_t caller_reads = 0;
  for (const Batch::Message& m : batch->messages) caller_reads += zero_copy && m.count == 1;
  {
    absl::MutexLock lock(&batch->mu);
    batch->started = true;
    if (ep.ok()) batch->caller_reads = caller_reads;
  }
  for (size_t m = 0; m < batch->messages.size(); ++m) {
    ops_.emplace(batch->messages[m].request_id, Op{.batch = batch, .message = m});
  }
  for (size_t m = 0; m < batch->messages.size(); ++m) {
    Batch::Message& message = batch->messages[m];
    const uint64_t id = message.request_id;
    if (!ep.ok()) {
      Finish(id, ep.status());
      continue;
    }
    if (batch->write && !(zero_copy && message.count == 1)) {
      // Packed just before it leaves, so that the first message is on its way while the
      // next ones are packed.
      message.staging.reserve(static_cast<size_t>(message.bytes));
      for (size_t i = message.first; i < message.first + message.count; ++i) {
        message.staging.append(reinterpret_cast<const char*>(batch->regions[i].bytes.data()),
                               batch->regions[i].bytes.size());
      }
      if (m > 0) ucp_worker_progress(worker_->worker());  // move what was sent meanwhile
    }
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    auto* pending = new Pending{.client = this,
                                .batch = batch,
                                .request_id = id,
                                .caller_memory = batch->write && message.staging.empty()};
    param.user_data = pending;
    static constexpr auto sent = +[](Pending* p, ucs_status_t status) {
      if (p->caller_memory) {
        auto* b = static_cast<Batch*>(p->batch.get());
        absl::MutexLock lock(&b->mu);
        --b->caller_reads;
      }
      if (status != UCS_OK) {
        p->client->Finish(p->request_id,
                          absl::UnavailableError(absl::StrCat("cache store fabric: send failed: ",
                                                              ucs_status_string(status))));
      }
      delete p;
    };
    param.cb.send = +[](void* request, ucs_status_t status, void* user_data) {
      sent(static_cast<Pending*>(user_data), status);
      ucp_request_free(request);
    };
    const auto [buffer, count] =
        batch->write ? batch->Source(m) : std::pair<const void*, size_t>{nullptr, 0};
    ucs_status_ptr_t request =
        ucp_am_send_nbx(*ep, batch->write ? fabric::kPut : fabric::kGet, message.header.data(),
                        message.header.size(), buffer, count, &param);
    if (request == nullptr) {
      sent(pending, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      sent(pending, UCS_PTR_STATUS(request));
    }
  }
}

void UcxKvClient::Finish(uint64_t request_id, absl::Status status) {
  auto it = ops_.find(request_id);
  if (it == ops_.end()) return;  // finished already (failed, then answered late)
  std::shared_ptr<Batch> batch = std::move(it->second.batch);
  const size_t message = it->second.message;
  ops_.erase(it);
  absl::MutexLock lock(&batch->mu);
  if (!status.ok() && batch->status.ok()) batch->status = std::move(status);
  if (status.ok() && !batch->write) batch->arrived.push_back(message);
  --batch->ops_left;
}

void UcxKvClient::FailAll(const std::string& address, const absl::Status& status) {
  std::vector<uint64_t> failed;
  for (const auto& [id, op] : ops_) {
    if (op.batch->address == address) failed.push_back(id);
  }
  for (uint64_t id : failed) Finish(id, status);
}

ucs_status_t UcxKvClient::OnReply(bool get, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  KvReplyHeader h;
  if (header_length != sizeof h) return UCS_OK;
  std::memcpy(&h, header, sizeof h);
  auto it = ops_.find(h.request_id);
  if (h.version != fabric::kKvProtocolVersion || it == ops_.end()) return UCS_OK;  // dropped
  Batch& batch = *it->second.batch;
  const size_t m = it->second.message;
  const Batch::Message& message = batch.messages[m];
  if (h.code != 0) {
    Finish(h.request_id,
           absl::Status(static_cast<absl::StatusCode>(h.code),
                        absl::StrCat("cache store fabric: the shard refused blocks ",
                                     batch.regions[message.first].index, "..",
                                     batch.regions[message.first + message.count - 1].index,
                                     " of lease ", batch.lease_id)));
    return UCS_OK;
  }
  if (!get) {
    Finish(h.request_id, absl::OkStatus());
    return UCS_OK;
  }
  if (static_cast<int64_t>(length) != message.bytes) {
    Finish(h.request_id, absl::InternalError(absl::StrCat("cache store fabric: ", length,
                                                          " bytes for blocks of ", message.bytes)));
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {  // eager: the bytes are here now
    const char* from = static_cast<const char*>(data);
    for (size_t i = message.first; i < message.first + message.count; ++i) {
      const auto length = static_cast<size_t>(batch.regions[i].length);
      batch.buffers[i].assign(from, length);  // no zero-fill first
      from += length;
    }
    Finish(h.request_id, absl::OkStatus());
    return UCS_OK;
  }
  // Rendezvous: receive into the batch's buffers after this callback returns.
  auto* pending = new Pending{.client = this,
                              .batch = it->second.batch,
                              .request_id = h.request_id,
                              .caller_memory = false};
  worker_->Post([this, pending, data, m] {
    ucp_request_param_t recv{};
    recv.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    recv.user_data = pending;
    static constexpr auto received = +[](Pending* p, ucs_status_t status) {
      p->client->Finish(p->request_id, status == UCS_OK
                                           ? absl::OkStatus()
                                           : absl::UnavailableError(absl::StrCat(
                                                 "cache store fabric: receive failed: ",
                                                 ucs_status_string(status))));
      delete p;
    };
    recv.cb.recv_am = +[](void* request, ucs_status_t status, size_t, void* user_data) {
      received(static_cast<Pending*>(user_data), status);
      ucp_request_free(request);
    };
    const auto [buffer, count] = static_cast<Batch*>(pending->batch.get())->Destination(m, recv);
    ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_->worker(), data, buffer, count, &recv);
    if (request == nullptr) {
      received(pending, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      received(pending, UCS_PTR_STATUS(request));
    }
  });
  return UCS_INPROGRESS;
}

absl::Status UcxArenaPath::CheckRegion(int64_t offset, int64_t length) const {
  return ValidateShmRegion(offset, length, arena_bytes_);
}

absl::StatusOr<std::vector<uint64_t>> UcxArenaPath::Write(const LeaseGrant& lease,
                                                          std::span<const ArenaRegion> regions) {
  for (const ArenaRegion& r : regions) {
    if (static_cast<int64_t>(r.bytes.size()) != r.length) {
      return absl::InvalidArgumentError("cache store fabric: a block and its region differ");
    }
  }
  // The checksums are computed while UCX moves the same bytes (both only read them).
  std::vector<uint64_t> checksums;
  checksums.reserve(regions.size());
  absl::Status s =
      client_->Write(address_, lease, regions, UcxKvClient::Clock::now() + timeout_, [&] {
        for (const ArenaRegion& r : regions) checksums.push_back(BlockChecksum64(r.bytes));
      });
  if (!s.ok()) return s;
  return checksums;
}

absl::StatusOr<std::vector<uint64_t>> UcxArenaPath::Read(const LeaseGrant& lease,
                                                         std::span<const ArenaRegion> regions,
                                                         std::span<std::string> out) {
  // Each message's checksums are computed as it arrives, while the next ones move.
  std::vector<uint64_t> checksums(regions.size());
  absl::Status s = client_->Read(
      address_, lease, regions, out, UcxKvClient::Clock::now() + timeout_,
      [&checksums](size_t first, std::span<const std::string> blocks) {
        for (const std::string& block : blocks) {
          checksums[first++] =
              BlockChecksum64({reinterpret_cast<const uint8_t*>(block.data()), block.size()});
        }
      });
  if (!s.ok()) return s;
  return checksums;
}

}  // namespace tandem::store
