#include "common/store/ucx_client.h"

#include <cstring>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fabric/kv_protocol.h"
#include "common/store/block_checksum.h"
#include "common/store/shm_mapping.h"

namespace tandem::store {
namespace {

using fabric::KvReplyHeader;
using fabric::KvRequestHeader;

}  // namespace

// One call's blocks. Shared by the caller and the worker thread's ops, requests and receives,
// so that whatever UCX completes late still writes into (or reads from) live memory.
struct UcxKvClient::Batch {
  std::string address;
  bool write = false;
  std::vector<ArenaRegion> regions;  // a write's `bytes` are the caller's, read until sent
  std::vector<KvRequestHeader> headers;
  std::vector<std::string> buffers;  // a read's blocks
  // A write's copies of its blocks, where the endpoint cannot tell a dead peer (see
  // UcxWorker::detects_peer_failures): UCX may then hold a send for ever.
  std::vector<std::string> staging;

  absl::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;   // the worker thread has sent (or failed) it all
  size_t ops_left ABSL_GUARDED_BY(mu) = 0;    // blocks not yet answered or failed
  size_t caller_reads ABSL_GUARDED_BY(mu) = 0;  // sends UCX may still read the caller's bytes for
  absl::Status status ABSL_GUARDED_BY(mu);    // the first failure
  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return started && ops_left == 0 && caller_reads == 0;
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
  client->worker_->Start();
  return client;
}

UcxKvClient::~UcxKvClient() {
  worker_.reset();  // forced closes complete every request; the batches' callers are gone
}

UcxKvClientStats UcxKvClient::Stats() const {
  return {.put_blocks = put_blocks_.load(),
          .get_blocks = get_blocks_.load(),
          .put_bytes = put_bytes_.load(),
          .get_bytes = get_bytes_.load(),
          .failed_batches = failed_batches_.load()};
}

absl::Status UcxKvClient::Write(const std::string& address, const LeaseGrant& lease,
                                std::span<const ArenaRegion> regions, Clock::time_point deadline,
                                const std::function<void()>& meanwhile) {
  return Run(address, lease, regions, {}, deadline, meanwhile);
}

absl::Status UcxKvClient::Read(const std::string& address, const LeaseGrant& lease,
                               std::span<const ArenaRegion> regions, std::span<std::string> out,
                               Clock::time_point deadline) {
  return Run(address, lease, regions, out, deadline, nullptr);
}

absl::Status UcxKvClient::Run(const std::string& address, const LeaseGrant& lease,
                              std::span<const ArenaRegion> regions, std::span<std::string> out,
                              Clock::time_point deadline, const std::function<void()>& meanwhile) {
  if (regions.empty()) return absl::OkStatus();
  auto batch = std::make_shared<Batch>();
  batch->address = address;
  batch->write = out.empty();
  batch->regions.assign(regions.begin(), regions.end());
  batch->headers.resize(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    KvRequestHeader& h = batch->headers[i];
    h.index = regions[i].index;
    h.lease_id = lease.id;
    h.key[0] = lease.key[0];
    h.key[1] = lease.key[1];
    h.offset = regions[i].offset;
    h.length = regions[i].length;
  }
  if (!batch->write) batch->buffers.resize(regions.size());
  {
    absl::MutexLock lock(&batch->mu);
    batch->ops_left = regions.size();
  }
  worker_->Post([this, batch] { Start(batch); });
  if (meanwhile) meanwhile();

  absl::MutexLock lock(&batch->mu);
  const auto done = [&batch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch->mu) { return batch->Done(); };
  if (!batch->mu.AwaitWithTimeout(absl::Condition(&done),
                                  absl::FromChrono(deadline - Clock::now()))) {
    // Late: close the endpoint, which completes every request on it with an error, and wait for
    // that (UCX guarantees it where it detects failed peers; elsewhere no send reads the
    // caller's bytes), so that no send reads the caller's buffers after this returns.
    batch->mu.Unlock();
    worker_->Post([this, address] {
      worker_->DropEndpoint(address);
      FailAll(address, absl::DeadlineExceededError("cache store fabric: transfer timed out"));
    });
    batch->mu.Lock();
    batch->mu.Await(absl::Condition(&done));
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
  const bool zero_copy = batch->write && worker_->detects_peer_failures();
  if (batch->write && !zero_copy) {
    batch->staging.reserve(batch->regions.size());
    for (ArenaRegion& r : batch->regions) {
      batch->staging.emplace_back(reinterpret_cast<const char*>(r.bytes.data()), r.bytes.size());
      r.bytes = {reinterpret_cast<const uint8_t*>(batch->staging.back().data()), r.bytes.size()};
    }
  }
  {
    absl::MutexLock lock(&batch->mu);
    batch->started = true;
    if (zero_copy && ep.ok()) batch->caller_reads = batch->regions.size();
  }
  std::vector<uint64_t> ids;
  ids.reserve(batch->regions.size());
  for (size_t i = 0; i < batch->regions.size(); ++i) {
    const uint64_t id = next_request_id_++;
    batch->headers[i].request_id = id;
    ops_.emplace(id, Op{.batch = batch, .region = i});
    ids.push_back(id);
  }
  for (size_t i = 0; i < batch->regions.size(); ++i) {
    if (!ep.ok()) {
      Finish(ids[i], ep.status());
      continue;
    }
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    auto* pending = new Pending{
        .client = this, .batch = batch, .request_id = ids[i], .caller_memory = zero_copy};
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
    const ArenaRegion& r = batch->regions[i];
    ucs_status_ptr_t request = ucp_am_send_nbx(
        *ep, batch->write ? fabric::kPutBlock : fabric::kGetBlock, &batch->headers[i],
        sizeof(KvRequestHeader), batch->write ? r.bytes.data() : nullptr,
        batch->write ? r.bytes.size() : 0, &param);
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
  ops_.erase(it);
  absl::MutexLock lock(&batch->mu);
  if (!status.ok() && batch->status.ok()) batch->status = std::move(status);
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
  const size_t region = it->second.region;
  if (h.code != 0) {
    Finish(h.request_id, absl::Status(static_cast<absl::StatusCode>(h.code),
                                      absl::StrCat("cache store fabric: the shard refused block ",
                                                   batch.regions[region].index, " of lease ",
                                                   batch.headers[region].lease_id)));
    return UCS_OK;
  }
  if (!get) {
    Finish(h.request_id, absl::OkStatus());
    return UCS_OK;
  }
  if (static_cast<int64_t>(length) != batch.regions[region].length) {
    Finish(h.request_id, absl::InternalError(absl::StrCat("cache store fabric: ", length,
                                                          " bytes for a block of ",
                                                          batch.regions[region].length)));
    return UCS_OK;
  }
  std::string& buffer = batch.buffers[region];
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {  // eager: the bytes are here now
    buffer.assign(static_cast<const char*>(data), length);
    Finish(h.request_id, absl::OkStatus());
    return UCS_OK;
  }
  // Rendezvous: receive into the batch's buffer after this callback returns.
  buffer.resize(length);
  auto* pending = new Pending{.client = this,
                              .batch = it->second.batch,
                              .request_id = h.request_id,
                              .caller_memory = false};
  worker_->Post([this, pending, data, &buffer] {
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
    ucs_status_ptr_t request =
        ucp_am_recv_data_nbx(worker_->worker(), data, buffer.data(), buffer.size(), &recv);
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
  absl::Status s =
      client_->Read(address_, lease, regions, out, UcxKvClient::Clock::now() + timeout_);
  if (!s.ok()) return s;
  std::vector<uint64_t> checksums;
  checksums.reserve(regions.size());
  for (const std::string& block : out) {
    checksums.push_back(
        BlockChecksum64({reinterpret_cast<const uint8_t*>(block.data()), block.size()}));
  }
  return checksums;
}

}  // namespace tandem::store
