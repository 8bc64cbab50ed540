#include "cache_store/cache_store_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "common/util/status_macros.h"

namespace tandem::cache_store {
namespace {

using tandem::v1::GetResponse;
using tandem::v1::PutRequest;
using tandem::v1::PutResponse;

// Reads the chunks of a Put stream. A message with block_bytes > 0 starts a block; later
// messages with the same hash and no header continue it. A block the shard already holds is
// skipped (its data is read and dropped). A stream that ends or fails inside a block abandons
// that block; blocks completed before it stay stored.
class PutReactor final : public grpc::ServerReadReactor<PutRequest> {
 public:
  PutReactor(BlockStore& store, PutResponse* response) : store_(store), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or the call broke)
      if (pending_ || skipping_) {
        // Abandoned before the client hears of it: a retry must not find the block "being
        // written" and skip it.
        pending_.reset();
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("stream ended inside block ", current_)));
        return;
      }
      Finish(grpc::Status::OK);
      return;
    }
    absl::Status s = Handle();
    if (!s.ok()) {
      pending_.reset();
      Finish(rpc::ToGrpcStatus(s));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Handle() {
    if (request_.block_bytes() > 0) {
      if (pending_ || skipping_) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", current_, " ended before all of its bytes arrived"));
      }
      TANDEM_RETURN_IF_ERROR(Begin());
    } else if (!pending_ && !skipping_) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of block ", request_.block_hash(), " without its header"));
    } else if (request_.block_hash() != current_) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of block ", request_.block_hash(), " inside block ", current_));
    }
    const std::string& data = request_.data();
    if (skipping_) {
      skip_left_ -= static_cast<int64_t>(data.size());
      if (skip_left_ < 0) {
        return absl::OutOfRangeError(absl::StrCat("block ", current_, ": too many bytes"));
      }
      skipping_ = skip_left_ > 0;
      return absl::OkStatus();
    }
    TANDEM_RETURN_IF_ERROR(
        pending_->Append({reinterpret_cast<const uint8_t*>(data.data()), data.size()}));
    if (pending_->written() == pending_->size()) {
      absl::Status s = pending_->Commit();
      pending_.reset();
      TANDEM_RETURN_IF_ERROR(s);
      response_->set_stored(response_->stored() + 1);
    }
    return absl::OkStatus();
  }

  absl::Status Begin() {
    current_ = request_.block_hash();
    absl::StatusOr<PendingPut> put =
        store_.BeginPut(current_, request_.block_bytes(), request_.checksum());
    if (absl::IsAlreadyExists(put.status())) {
      response_->set_skipped(response_->skipped() + 1);
      skipping_ = true;
      skip_left_ = request_.block_bytes();
      return absl::OkStatus();
    }
    if (!put.ok()) return put.status();
    pending_.emplace(*std::move(put));
    return absl::OkStatus();
  }

  BlockStore& store_;
  PutResponse* response_;
  PutRequest request_;
  uint64_t current_ = 0;
  std::optional<PendingPut> pending_;
  bool skipping_ = false;
  int64_t skip_left_ = 0;
};

// Streams the requested blocks in order, `chunk_bytes` of data per message. Each block is
// pinned from its first chunk until its last one has been written. Blocks on disk are read back
// first, all at once, on the store's promote threads (the first write starts there; gRPC holds
// writes started before the reactor is bound).
class GetReactor final : public grpc::ServerWriteReactor<GetResponse> {
 public:
  GetReactor(BlockStore& store, const tandem::v1::GetRequest& request, int64_t chunk_bytes)
      : store_(store), request_(request), chunk_bytes_(chunk_bytes) {
    store_.PromoteThen({request_.block_hashes().begin(), request_.block_hashes().end()},
                       [this](std::vector<bool> from_disk) {
                         from_disk_ = std::move(from_disk);
                         Next();
                       });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {  // the client went away
      block_.Reset();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading"));
      return;
    }
    Next();
  }

  void OnDone() override { delete this; }

 private:
  void Next() {
    response_.Clear();
    if (block_.data().empty()) {  // start the next block
      block_.Reset();
      if (index_ == request_.block_hashes_size()) {
        Finish(grpc::Status::OK);
        return;
      }
      const bool from_disk = from_disk_[index_];
      const uint64_t hash = request_.block_hashes(index_++);
      response_.set_block_hash(hash);
      absl::StatusOr<BlockRef> ref = store_.Get(hash);
      if (!ref.ok()) {
        response_.set_found(false);
        StartWrite(&response_);
        return;
      }
      block_ = *std::move(ref);
      offset_ = 0;
      response_.set_found(true);
      response_.set_block_bytes(static_cast<int64_t>(block_.data().size()));
      response_.set_checksum(block_.checksum());
      response_.set_tier(from_disk ? tandem::v1::STORE_TIER_DISK : tandem::v1::STORE_TIER_MEMORY);
    } else {
      response_.set_block_hash(block_.hash());
      response_.set_found(true);
    }
    const int64_t n = std::min<int64_t>(chunk_bytes_, block_.data().size() - offset_);
    response_.set_data(block_.data().data() + offset_, n);
    offset_ += n;
    if (offset_ == static_cast<int64_t>(block_.data().size())) {
      // The bytes are copied into the message: the pin can go before the write completes.
      block_.Reset();
    }
    StartWrite(&response_);
  }

  BlockStore& store_;
  const tandem::v1::GetRequest request_;
  const int64_t chunk_bytes_;
  std::vector<bool> from_disk_;  // per requested block: Promote read it back; set before Next
  int index_ = 0;
  BlockRef block_;
  int64_t offset_ = 0;
  GetResponse response_;
};

// Finishes a unary call with `status`, mapped at the edge.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

}  // namespace

CacheStoreService::CacheStoreService(BlockStore& store, int64_t chunk_bytes,
                                     const ShmHandoffOptions& shm,
                                     const security::Authorizer& authorizer)
    : store_(store),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 1)),
      shm_(store, shm),
      authorizer_(authorizer) {}

grpc::ServerReadReactor<PutRequest>* CacheStoreService::Put(grpc::CallbackServerContext* context,
                                                            PutResponse* response) {
  grpc::Status allowed = authorizer_.Check(*context, "/tandem.v1.CacheStore/Put");
  if (!allowed.ok()) return security::Refuse<grpc::ServerReadReactor<PutRequest>>(allowed);
  return new PutReactor(store_, response);
}

grpc::ServerWriteReactor<GetResponse>* CacheStoreService::Get(
    grpc::CallbackServerContext* context, const tandem::v1::GetRequest* request) {
  grpc::Status allowed = authorizer_.Check(*context, "/tandem.v1.CacheStore/Get");
  if (!allowed.ok()) return security::Refuse<grpc::ServerWriteReactor<GetResponse>>(allowed);
  return new GetReactor(store_, *request, chunk_bytes_);
}

grpc::ServerUnaryReactor* CacheStoreService::Exists(grpc::CallbackServerContext* context,
                                                    const tandem::v1::ExistsRequest* request,
                                                    tandem::v1::ExistsResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/Exists")) {
    return denied;
  }
  for (uint64_t hash : request->block_hashes()) response->add_present(store_.Exists(hash));
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CacheStoreService::GetStats(grpc::CallbackServerContext* context,
                                                      const tandem::v1::GetStatsRequest*,
                                                      tandem::v1::StoreStats* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/GetStats")) {
    return denied;
  }
  const BlockStoreStats s = store_.Stats();
  response->set_capacity_bytes(s.capacity_bytes);
  response->set_used_bytes(s.used_bytes);
  response->set_blocks(s.blocks);
  response->set_pinned_blocks(s.pinned_blocks);
  response->set_puts(s.puts);
  response->set_gets(s.hits + s.misses);
  response->set_hits(s.hits);
  response->set_misses(s.misses);
  response->set_evictions(s.evictions);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CacheStoreService::AttachSharedMemory(
    grpc::CallbackServerContext* context, const tandem::v1::AttachSharedMemoryRequest*,
    tandem::v1::AttachSharedMemoryResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/AttachSharedMemory")) {
    return denied;
  }
  return Answer(context, shm_.Attach(response));
}

grpc::ServerUnaryReactor* CacheStoreService::ReserveShm(
    grpc::CallbackServerContext* context, const tandem::v1::ReserveShmRequest* request,
    tandem::v1::ReserveShmResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/ReserveShm")) {
    return denied;
  }
  return Answer(context, shm_.Reserve(*request, response, context->peer()));
}

grpc::ServerUnaryReactor* CacheStoreService::CommitShm(grpc::CallbackServerContext* context,
                                                       const tandem::v1::CommitShmRequest* request,
                                                       tandem::v1::CommitShmResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/CommitShm")) {
    return denied;
  }
  return Answer(context, shm_.Commit(*request, response, context->peer()));
}

grpc::ServerUnaryReactor* CacheStoreService::AcquireShm(
    grpc::CallbackServerContext* context, const tandem::v1::AcquireShmRequest* request,
    tandem::v1::AcquireShmResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/AcquireShm")) {
    return denied;
  }
  auto* reactor = context->DefaultReactor();
  shm_.Acquire(*request, response, context->peer(), [reactor](const absl::Status& status) {
    reactor->Finish(rpc::ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CacheStoreService::ReleaseShm(
    grpc::CallbackServerContext* context, const tandem::v1::ReleaseShmRequest* request,
    tandem::v1::ReleaseShmResponse*) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/ReleaseShm")) {
    return denied;
  }
  return Answer(context, shm_.Release(*request, context->peer()));
}

absl::Status CacheStoreService::EnableFabric(const std::string& transports) {
  absl::StatusOr<std::unique_ptr<UcxDataPlane>> plane = UcxDataPlane::Create(shm_, transports);
  if (!plane.ok()) return plane.status();
  fabric_ = *std::move(plane);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CacheStoreService::AttachFabric(
    grpc::CallbackServerContext* context, const tandem::v1::AttachFabricRequest*,
    tandem::v1::AttachFabricResponse* response) {
  if (auto* denied = authorizer_.DenyUnary(context, "/tandem.v1.CacheStore/AttachFabric")) {
    return denied;
  }
  if (fabric_ == nullptr) {
    return Answer(context, absl::FailedPreconditionError("the KV fabric is off on this shard"));
  }
  fabric_->Attach(response);
  return Answer(context, absl::OkStatus());
}

}  // namespace tandem::cache_store
