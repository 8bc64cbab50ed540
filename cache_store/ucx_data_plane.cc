#include "cache_store/ucx_data_plane.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/fabric/kv_protocol.h"

namespace tandem::cache_store {

using fabric::KvReplyHeader;

// One message's blocks moving under a borrowed lease; lives until UCX completes the transfer
// (the UCX request's user data, as UCX's C callbacks require), or until the plane is destroyed.
struct UcxDataPlane::Transfer {
  UcxDataPlane* plane = nullptr;
  ShmHandoff::Borrowed borrowed;
  ucp_ep_h ep = nullptr;
  uint64_t serial = 0;  // UcxDataPlane::Track's
  KvReplyHeader reply;  // a get's reply header, which must live while it is sent
  int64_t bytes = 0;
  std::vector<ucp_dt_iov_t> iov;  // a put's blocks, when there are several
  // A get's blocks back to back, when there are several: UCX 1.13 sends an iovec through its
  // slow fragmenting protocols, a contiguous buffer with zero copy.
  std::unique_ptr<uint8_t[]> packed;

  // Points `param` at where a put's blocks are received: one region of the registered arena,
  // or an iovec of them (UCX scatters the contiguous send into it). Returns UCX's buffer and
  // count.
  std::pair<void*, size_t> Destination(ucp_request_param_t& param, ucp_mem_h arena) {
    if (borrowed.blocks.size() == 1) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = arena;
      return {borrowed.blocks[0].data(), borrowed.blocks[0].size()};
    }
    iov.reserve(borrowed.blocks.size());
    for (std::span<uint8_t> b : borrowed.blocks) iov.push_back({b.data(), b.size()});
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    return {iov.data(), iov.size()};
  }
  // Points `param` at what a get sends: its one block in the registered arena where a send
  // can be cancelled (`cancellable`: UcxWorker::detects_peer_failures), or a copy of the
  // blocks back to back, which lets go of their pins at once. Returns UCX's buffer and count.
  std::pair<const void*, size_t> Source(ucp_request_param_t& param, ucp_mem_h arena,
                                        bool cancellable) {
    if (borrowed.blocks.size() == 1 && cancellable) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = arena;
      return {borrowed.blocks[0].data(), borrowed.blocks[0].size()};
    }
    packed.reset(new uint8_t[static_cast<size_t>(bytes)]);  // no zero-fill: all overwritten
    uint8_t* to = packed.get();
    for (std::span<const uint8_t> b : borrowed.blocks) to = std::copy(b.begin(), b.end(), to);
    borrowed.lease.reset();  // the bytes are the transfer's own now: the pins can end
    return {packed.get(), static_cast<size_t>(bytes)};
  }
};

namespace {

ShmLeases::Key KeyOf(const fabric::KvRequestHeader& h) { return {h.key[0], h.key[1]}; }

}  // namespace

absl::StatusOr<std::unique_ptr<UcxDataPlane>> UcxDataPlane::Create(ShmHandoff& handoff,
                                                                   const std::string& transports) {
  const ShmArena* arena = handoff.arena();
  if (arena == nullptr) {
    return absl::FailedPreconditionError(
        "the UCX data plane moves bytes in and out of the shard's arena, and this shard keeps "
        "its blocks in private memory (cache_store.shared_memory: false)");
  }
  std::unique_ptr<UcxDataPlane> plane(new UcxDataPlane(handoff));
  UcxDataPlane* self = plane.get();
  fabric::UcxWorkerOptions options;
  options.name = "tandem-cache-store";
  options.transports = transports;
  options.handlers.emplace_back(
      fabric::kPut, [self](const void* header, size_t header_length, void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
        return self->OnPut(header, header_length, data, length, param);
      });
  options.handlers.emplace_back(fabric::kGet,
                                [self](const void* header, size_t header_length, void*, size_t,
                                       const ucp_am_recv_param_t* param) {
                                  return self->OnGet(header, header_length, param);
                                });
  absl::StatusOr<std::unique_ptr<fabric::UcxWorker>> worker =
      fabric::UcxWorker::Create(std::move(options));
  if (!worker.ok()) return worker.status();
  plane->worker_ = *std::move(worker);
  absl::StatusOr<ucp_mem_h> memh =
      plane->worker_->Register(arena->data(), static_cast<size_t>(arena->data_bytes()));
  if (!memh.ok()) return memh.status();
  plane->arena_memh_ = *memh;
  plane->worker_->Start();
  return plane;
}

UcxDataPlane::~UcxDataPlane() {
  fabric::DestroyWorker(worker_);  // first: what it completes as it stops uses the rest
  for (const auto& [serial, tracked] : transfers_) delete tracked.transfer;  // never completed
}

uint64_t UcxDataPlane::Track(Transfer* transfer, Counters& counters) {
  const uint64_t serial = ++next_serial_;
  const auto deadline = std::chrono::steady_clock::now() + handoff_.lease_time();
  transfers_.emplace(serial,
                     Tracked{.transfer = transfer, .counters = &counters, .deadline = deadline});
  if (!sweep_pending_) {
    sweep_pending_ = true;
    worker_->RunAt(deadline, [this] { Sweep(); });
  }
  return serial;
}

void UcxDataPlane::Sweep() {
  sweep_pending_ = false;
  const auto now = std::chrono::steady_clock::now();
  std::vector<ucp_ep_h> stalled;
  std::optional<std::chrono::steady_clock::time_point> next;
  for (const auto& [serial, tracked] : transfers_) {
    if (tracked.cancelled) continue;
    if (tracked.deadline > now) {
      next = std::min(next.value_or(tracked.deadline), tracked.deadline);
    } else if (std::find(stalled.begin(), stalled.end(), tracked.transfer->ep) == stalled.end()) {
      stalled.push_back(tracked.transfer->ep);
    }
  }
  // Their peers stopped answering (a worker stopped or killed mid-transfer: UCX 1.13's
  // shared-memory transports never tell). Closing a peer's endpoint completes every transfer on
  // it with an error, which lets go of their leases' blocks; the peer's next message builds a
  // new one.
  for (ucp_ep_h ep : stalled) {
    for (auto& [serial, tracked] : transfers_) {
      if (tracked.transfer->ep != ep || tracked.cancelled) continue;
      tracked.cancelled = true;
      ++tracked.counters->timed_out;
    }
    worker_->CloseEndpoint(ep);
  }
  if (next.has_value()) {
    sweep_pending_ = true;
    worker_->RunAt(*next, [this] { Sweep(); });
  }
}

bool UcxDataPlane::Untrack(uint64_t serial) {
  auto it = transfers_.find(serial);
  const bool live = !it->second.cancelled;
  transfers_.erase(it);
  return live;
}

void UcxDataPlane::Attach(tandem::v1::AttachFabricResponse* response) const {
  response->set_worker_address(worker_->address());
  response->set_instance_id(handoff_.arena()->instance_id());
  response->set_lease_ms(handoff_.lease_time().count());
  response->set_arena_bytes(handoff_.arena()->file_bytes());
  response->set_protocol(fabric::kKvProtocolVersion);
}

UcxDataPlaneStats::Direction UcxDataPlane::Counters::Load() const {
  return {.blocks = blocks.load(),
          .bytes = bytes.load(),
          .messages = messages.load(),
          .refused = refused.load(),
          .failed = failed.load(),
          .timed_out = timed_out.load()};
}

UcxDataPlaneStats UcxDataPlane::Stats() const { return {.put = put_.Load(), .get = get_.Load()}; }

void UcxDataPlane::Reply(ucp_ep_h ep, unsigned id, uint64_t request_id, absl::StatusCode code) {
  auto* reply = new KvReplyHeader{.code = static_cast<int32_t>(code), .request_id = request_id};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = reply;
  param.cb.send = +[](void* request, ucs_status_t, void* user_data) {
    delete static_cast<KvReplyHeader*>(user_data);
    ucp_request_free(request);
  };
  ucs_status_ptr_t request = ucp_am_send_nbx(ep, id, reply, sizeof *reply, nullptr, 0, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) delete reply;  // done, or the peer is gone
}

ucs_status_t UcxDataPlane::OnPut(const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
  ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  std::optional<fabric::KvRequest> request = fabric::ParseKvRequest(header, header_length);
  if (ep == nullptr || !request || static_cast<int64_t>(length) != request->bytes) {
    ++put_.refused;
    if (ep != nullptr) {
      worker_->Post([this, ep, id = fabric::PeekKvRequestId(header, header_length)] {
        Reply(ep, fabric::kPutDone, id, absl::StatusCode::kInvalidArgument);
      });
    }
    return UCS_OK;  // a rendezvous not received is dropped; the sender completes
  }
  const fabric::KvRequestHeader& h = request->header;
  absl::StatusOr<ShmHandoff::Borrowed> borrowed =
      handoff_.BorrowBlocks(h.lease_id, KeyOf(h), /*write=*/true, request->blocks);
  if (!borrowed.ok()) {
    ++put_.refused;
    worker_->Post([this, ep, id = h.request_id, code = borrowed.status().code()] {
      Reply(ep, fabric::kPutDone, id, code);
    });
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {  // eager: the bytes are here now
    const char* from = static_cast<const char*>(data);
    for (std::span<uint8_t> block : borrowed->blocks) {
      std::memcpy(block.data(), from, block.size());
      from += block.size();
    }
    put_.Moved(borrowed->blocks.size(), request->bytes);
    borrowed->lease.reset();  // before the reply: a commit the reply allows finds it free
    worker_->Post(
        [this, ep, id = h.request_id] { Reply(ep, fabric::kPutDone, id, absl::StatusCode::kOk); });
    return UCS_OK;
  }
  // Rendezvous: receive straight into the reserved blocks, after this callback returns.
  auto* transfer = new Transfer{.plane = this,
                                .borrowed = *std::move(borrowed),
                                .ep = ep,
                                .reply = {.request_id = h.request_id},
                                .bytes = request->bytes};
  transfer->serial = Track(transfer, put_);
  worker_->Post([this, transfer, data] {
    ucp_request_param_t recv{};
    recv.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    recv.user_data = transfer;
    const auto [buffer, count] = transfer->Destination(recv, arena_memh_);
    static constexpr auto done = +[](Transfer* t, ucs_status_t status) {
      UcxDataPlane* plane = t->plane;
      const bool live = plane->Untrack(t->serial);
      if (status == UCS_OK) {
        plane->put_.Moved(t->borrowed.blocks.size(), t->bytes);
      } else if (live) {
        ++plane->put_.failed;
      }
      t->borrowed.lease.reset();  // before the reply: a commit the reply allows finds it free
      // A failed transfer's endpoint failed or was closed: the peer's deadline tells it.
      if (status == UCS_OK && live) {
        plane->Reply(t->ep, fabric::kPutDone, t->reply.request_id, absl::StatusCode::kOk);
      }
      delete t;
    };
    recv.cb.recv_am = +[](void* request, ucs_status_t status, size_t, void* user_data) {
      done(static_cast<Transfer*>(user_data), status);
      ucp_request_free(request);
    };
    ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_->worker(), data, buffer, count, &recv);
    if (request == nullptr) {
      done(transfer, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      done(transfer, UCS_PTR_STATUS(request));
    }
  });
  return UCS_INPROGRESS;
}

ucs_status_t UcxDataPlane::OnGet(const void* header, size_t header_length,
                                 const ucp_am_recv_param_t* param) {
  ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  if (ep == nullptr) {
    ++get_.refused;
    return UCS_OK;
  }
  std::optional<fabric::KvRequest> request = fabric::ParseKvRequest(header, header_length);
  absl::StatusOr<ShmHandoff::Borrowed> borrowed =
      request ? handoff_.BorrowBlocks(request->header.lease_id, KeyOf(request->header),
                                      /*write=*/false, request->blocks)
              : absl::InvalidArgumentError("fabric: not a request of this protocol");
  const uint64_t id = fabric::PeekKvRequestId(header, header_length);
  if (!borrowed.ok()) {
    ++get_.refused;
    worker_->Post(
        [this, ep, id, code = borrowed.status().code()] { Reply(ep, fabric::kGetDone, id, code); });
    return UCS_OK;
  }
  auto* transfer = new Transfer{.plane = this,
                                .borrowed = *std::move(borrowed),
                                .ep = ep,
                                .reply = {.request_id = id},
                                .bytes = request->bytes};
  transfer->serial = Track(transfer, get_);
  worker_->Post([this, transfer] {
    ucp_request_param_t send{};
    send.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    send.user_data = transfer;
    const auto [buffer, count] =
        transfer->Source(send, arena_memh_, worker_->detects_peer_failures());
    static constexpr auto done = +[](Transfer* t, ucs_status_t status) {
      UcxDataPlane* plane = t->plane;
      const bool live = plane->Untrack(t->serial);
      if (status == UCS_OK) {
        plane->get_.Moved(t->borrowed.blocks.size(), t->bytes);
      } else if (live) {
        ++plane->get_.failed;
      }
      delete t;  // unpins, if the lease ended meanwhile
    };
    send.cb.send = +[](void* request, ucs_status_t status, void* user_data) {
      done(static_cast<Transfer*>(user_data), status);
      ucp_request_free(request);
    };
    ucs_status_ptr_t request = ucp_am_send_nbx(transfer->ep, fabric::kGetDone, &transfer->reply,
                                               sizeof transfer->reply, buffer, count, &send);
    if (request == nullptr) {
      done(transfer, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      done(transfer, UCS_PTR_STATUS(request));
    }
  });
  return UCS_OK;
}

}  // namespace tandem::cache_store
