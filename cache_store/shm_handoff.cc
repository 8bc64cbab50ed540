#include "cache_store/shm_handoff.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tandem::cache_store {
namespace {

std::string KeyBytes(const ShmLeases::Key& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), sizeof key);
}

}  // namespace

ShmHandoff::ShmHandoff(BlockStore& store, const ShmHandoffOptions& options)
    : store_(store), arena_(store.arena()), options_(options), leases_(options.leases) {}

absl::Status ShmHandoff::CheckInstance(uint64_t instance_id) const {
  if (arena_ == nullptr) {
    return absl::FailedPreconditionError("shared memory is off on this shard");
  }
  if (instance_id != arena_->instance_id()) {
    return absl::FailedPreconditionError(absl::StrCat("shared memory: instance ", instance_id,
                                                      " is not this shard's (",
                                                      arena_->instance_id(), "); attach again"));
  }
  return absl::OkStatus();
}

absl::Status ShmHandoff::CheckCount(int n) const {
  if (n > options_.max_blocks_per_call) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory: ", n, " blocks in one call, at most ", options_.max_blocks_per_call));
  }
  return absl::OkStatus();
}

absl::Status ShmHandoff::Attach(tandem::v1::AttachSharedMemoryResponse* response) const {
  if (arena_ == nullptr || !options_.offer_shared_memory) {
    return absl::FailedPreconditionError(
        "shared memory is off on this shard (cache_store.shared_memory: false)");
  }
  response->set_path(arena_->path());
  response->set_file_bytes(arena_->file_bytes());
  response->set_instance_id(arena_->instance_id());
  response->set_lease_ms(leases_.ttl().count());
  response->set_preallocated(arena_->preallocated());
  return absl::OkStatus();
}

absl::Status ShmHandoff::Reserve(const tandem::v1::ReserveShmRequest& request,
                                 tandem::v1::ReserveShmResponse* response,
                                 const std::string& peer) {
  TANDEM_RETURN_IF_ERROR(CheckInstance(request.instance_id()));
  TANDEM_RETURN_IF_ERROR(CheckCount(request.blocks_size()));
  ShmLeases::Lease lease;
  for (const tandem::v1::ShmBlockSize& block : request.blocks()) {
    tandem::v1::ShmReservation* r = response->add_reservations();
    r->set_block_hash(block.block_hash());
    absl::StatusOr<PendingPut> put =
        store_.BeginPut(block.block_hash(), block.block_bytes(), 0,
                        request.ahead() ? WhilePending::kSkip : WhilePending::kWriteToo);
    if (absl::IsAlreadyExists(put.status())) continue;  // the client skips it
    if (absl::IsAborted(put.status())) {                // another writer has it, for now
      r->set_pending(true);
      continue;
    }
    if (!put.ok()) return put.status();  // the lease's puts are abandoned
    r->set_reserved(true);
    r->set_offset(arena_->FileOffset(put->data().data()));
    lease.puts.push_back(*std::move(put));
  }
  if (!lease.puts.empty()) {
    const int64_t n = static_cast<int64_t>(lease.puts.size());
    TANDEM_ASSIGN_OR_RETURN(const ShmLeases::Added added,
                            leases_.Add(std::move(lease), peer, request.fabric()));
    response->set_lease_id(added.id);
    if (request.fabric()) response->set_fabric_key(KeyBytes(added.key));
    reserved_blocks_ += n;
  }
  return absl::OkStatus();
}

absl::Status ShmHandoff::Commit(const tandem::v1::CommitShmRequest& request,
                                tandem::v1::CommitShmResponse* response, const std::string& peer) {
  TANDEM_RETURN_IF_ERROR(CheckInstance(request.instance_id()));
  TANDEM_ASSIGN_OR_RETURN(const std::shared_ptr<ShmLeases::Lease> taken,
                          leases_.Take(request.lease_id(), ShmLeases::Kind::kWrite, peer));
  ShmLeases::Lease& lease = *taken;
  if (request.checksums_size() != static_cast<int>(lease.puts.size())) {
    return absl::InvalidArgumentError(absl::StrCat("shared memory: ", request.checksums_size(),
                                                   " checksums for ", lease.puts.size(),
                                                   " reserved blocks; nothing stored"));
  }
  int failed = 0;
  for (size_t i = 0; i < lease.puts.size(); ++i) {
    if (lease.puts[i]
            .CommitInPlace(request.checksums(static_cast<int>(i)), options_.verify_commits)
            .ok()) {
      response->set_stored(response->stored() + 1);
    } else {
      ++failed;
    }
  }
  committed_blocks_ += response->stored();
  if (failed > 0) {
    return absl::DataLossError(absl::StrCat("shared memory: ", failed, " of ", lease.puts.size(),
                                            " blocks do not match their checksums"));
  }
  return absl::OkStatus();
}

absl::Status ShmHandoff::Acquire(const tandem::v1::AcquireShmRequest& request,
                                 tandem::v1::AcquireShmResponse* response,
                                 const std::string& peer) {
  TANDEM_RETURN_IF_ERROR(CheckInstance(request.instance_id()));
  TANDEM_RETURN_IF_ERROR(CheckCount(request.block_hashes_size()));
  return Pin(request,
             store_.Promote(
                 {request.block_hashes().data(), static_cast<size_t>(request.block_hashes_size())}),
             response, peer);
}

void ShmHandoff::Acquire(const tandem::v1::AcquireShmRequest& request,
                         tandem::v1::AcquireShmResponse* response, std::string peer,
                         std::function<void(const absl::Status&)> done) {
  absl::Status valid = CheckInstance(request.instance_id());
  if (valid.ok()) valid = CheckCount(request.block_hashes_size());
  if (!valid.ok()) {
    done(valid);
    return;
  }
  store_.PromoteThen(
      {request.block_hashes().begin(), request.block_hashes().end()},
      [this, &request, response, peer = std::move(peer), done = std::move(done)](
          std::vector<bool> from_disk) { done(Pin(request, from_disk, response, peer)); });
}

absl::Status ShmHandoff::Pin(const tandem::v1::AcquireShmRequest& request,
                             const std::vector<bool>& from_disk,
                             tandem::v1::AcquireShmResponse* response, const std::string& peer) {
  ShmLeases::Lease lease;
  for (int i = 0; i < request.block_hashes_size(); ++i) {
    const uint64_t hash = request.block_hashes(i);
    tandem::v1::ShmBlockRegion* region = response->add_blocks();
    region->set_block_hash(hash);
    absl::StatusOr<BlockRef> ref = store_.Get(hash, ChecksumKind::kXxh3);
    if (!ref.ok()) continue;  // not found
    region->set_found(true);
    region->set_offset(arena_->FileOffset(ref->data().data()));
    region->set_block_bytes(static_cast<int64_t>(ref->data().size()));
    region->set_checksum(ref->checksum64());
    region->set_tier(from_disk[i] ? tandem::v1::STORE_TIER_DISK : tandem::v1::STORE_TIER_MEMORY);
    lease.pins.push_back(*std::move(ref));
  }
  if (!lease.pins.empty()) {
    const int64_t n = static_cast<int64_t>(lease.pins.size());
    TANDEM_ASSIGN_OR_RETURN(const ShmLeases::Added added,
                            leases_.Add(std::move(lease), peer, request.fabric()));
    response->set_lease_id(added.id);
    if (request.fabric()) response->set_fabric_key(KeyBytes(added.key));
    acquired_blocks_ += n;
  }
  return absl::OkStatus();
}

ShmHandoffStats ShmHandoff::Stats() const {
  return {.reserved_blocks = reserved_blocks_.load(),
          .committed_blocks = committed_blocks_.load(),
          .acquired_blocks = acquired_blocks_.load(),
          .open_leases = leases_.open(),
          .expired_leases = leases_.expired()};
}

absl::Status ShmHandoff::Release(const tandem::v1::ReleaseShmRequest& request,
                                 const std::string& peer) {
  TANDEM_RETURN_IF_ERROR(CheckInstance(request.instance_id()));
  return leases_.Take(request.lease_id(), ShmLeases::Kind::kAny, peer).status();
}

absl::StatusOr<ShmHandoff::Borrowed> ShmHandoff::BorrowBlocks(
    uint64_t lease_id, const ShmLeases::Key& key, bool write,
    std::span<const fabric::KvBlockRef> blocks) {
  Borrowed borrowed;
  TANDEM_ASSIGN_OR_RETURN(
      borrowed.lease,
      leases_.Borrow(lease_id, key, write ? ShmLeases::Kind::kWrite : ShmLeases::Kind::kRead));
  const ShmLeases::Lease& lease = *borrowed.lease;
  borrowed.blocks.reserve(blocks.size());
  for (const fabric::KvBlockRef& b : blocks) {
    std::span<uint8_t> bytes;
    if (write && b.index < lease.puts.size()) {
      bytes = lease.puts[b.index].data();
    } else if (!write && b.index < lease.pins.size()) {
      // A reader only reads: the span is mutable because the fabric registers the arena as one.
      const std::span<const uint8_t> pinned = lease.pins[b.index].data();
      bytes = {const_cast<uint8_t*>(pinned.data()), pinned.size()};
    }
    if (bytes.empty() || arena_->FileOffset(bytes.data()) != b.offset ||
        static_cast<int64_t>(bytes.size()) != b.length) {
      return absl::InvalidArgumentError(absl::StrCat("fabric: block ", b.index, " of lease ",
                                                     lease_id, " is not at ", b.offset, " (",
                                                     b.length, " bytes)"));
    }
    borrowed.blocks.push_back(bytes);
  }
  return borrowed;
}

}  // namespace tandem::cache_store
