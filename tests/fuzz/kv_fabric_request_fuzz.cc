// libFuzzer target: a KV fabric request header (common/fabric/kv_protocol.h) as a shard's data
// plane reads one from the network, then checked against a real lease (ShmHandoff's
// BorrowBlocks) as cache_store/ucx_data_plane.cc does before a byte moves. Lease id 1 and 2 in
// the input stand for the shard's open write and read leases with their real keys, and their
// blocks' offsets are then read as distances from the real ones, so that the region checks
// run near the truth; any other id is a forged one. Checks what the data plane relies on: a
// borrowed block is exactly the lease's block at that index, inside the arena.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache_store/block_store.h"
#include "cache_store/shm_handoff.h"
#include "common/fabric/kv_protocol.h"

namespace {

using namespace tandem;
using namespace tandem::cache_store;

struct Shard {
  std::unique_ptr<BlockStore> store;
  std::unique_ptr<ShmHandoff> handoff;
  uint64_t write_id = 0, read_id = 0;
  std::string write_key, read_key;
  std::vector<int64_t> write_offsets, read_offsets;  // of the leases' blocks, by index
};

Shard& TheShard() {
  static Shard* shard = [] {
    auto* s = new Shard;
    s->store = BlockStore::Create({.capacity_bytes = 1 << 20, .shared_memory = true}).value();
    s->handoff = std::make_unique<ShmHandoff>(*s->store, ShmHandoffOptions{});
    const uint64_t instance = s->store->arena()->instance_id();
    // A block to read, then three reserved for writing.
    tandem::v1::ReserveShmRequest reserve;
    reserve.set_instance_id(instance);
    reserve.set_model_id("m");
    reserve.set_fabric(true);
    auto* one = reserve.add_blocks();
    one->set_block_hash(100);
    one->set_block_bytes(5000);
    tandem::v1::ReserveShmResponse reserved;
    if (!s->handoff->Reserve(reserve, &reserved).ok()) abort();
    tandem::v1::CommitShmRequest commit;
    commit.set_instance_id(instance);
    commit.set_lease_id(reserved.lease_id());
    commit.add_checksums(0);
    tandem::v1::CommitShmResponse committed;
    s->handoff->Commit(commit, &committed);  // unverified: the checksum is not checked here
    tandem::v1::AcquireShmRequest acquire;
    acquire.set_instance_id(instance);
    acquire.set_model_id("m");
    acquire.set_fabric(true);
    acquire.add_block_hashes(100);
    tandem::v1::AcquireShmResponse acquired;
    if (!s->handoff->Acquire(acquire, &acquired).ok()) abort();
    s->read_id = acquired.lease_id();
    s->read_key = acquired.fabric_key();
    s->read_offsets.push_back(acquired.blocks(0).offset());
    reserve.clear_blocks();
    for (uint64_t h : {1, 2, 3}) {
      auto* b = reserve.add_blocks();
      b->set_block_hash(h);
      b->set_block_bytes(static_cast<int64_t>(h) * 4096 + 17);
    }
    if (!s->handoff->Reserve(reserve, &reserved).ok()) abort();
    s->write_id = reserved.lease_id();
    s->write_key = reserved.fabric_key();
    for (const auto& r : reserved.reservations()) s->write_offsets.push_back(r.offset());
    return s;
  }();
  return *shard;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Shard& shard = TheShard();
  std::optional<fabric::KvRequest> request = fabric::ParseKvRequest(data, size);
  const uint64_t refused_id = fabric::PeekKvRequestId(data, size);  // what a refusal echoes
  if (!request) return 0;
  const fabric::KvRequestHeader& h = request->header;
  if (refused_id != h.request_id) abort();
  if (request->blocks.size() != h.count || h.count == 0 ||
      h.count > fabric::kKvMaxBlocksPerMessage || size != fabric::KvHeaderBytes(h.count)) {
    abort();
  }
  int64_t bytes = 0;
  for (const fabric::KvBlockRef& b : request->blocks) {
    if (b.length <= 0) abort();
    bytes += b.length;
  }
  if (bytes != request->bytes) abort();

  const bool write = h.lease_id != 2;
  uint64_t id = h.lease_id;
  ShmLeases::Key key{h.key[0], h.key[1]};
  if (h.lease_id == 1 || h.lease_id == 2) {
    id = write ? shard.write_id : shard.read_id;
    std::memcpy(key.data(), (write ? shard.write_key : shard.read_key).data(), sizeof key);
    const std::vector<int64_t>& offsets = write ? shard.write_offsets : shard.read_offsets;
    for (fabric::KvBlockRef& b : request->blocks) {
      b.offset = static_cast<int64_t>(static_cast<uint64_t>(b.offset) +
                                      static_cast<uint64_t>(offsets[b.index % offsets.size()]));
    }
  }
  auto borrowed = shard.handoff->BorrowBlocks(id, key, write, request->blocks);
  if (!borrowed.ok()) return 0;
  if (id != shard.write_id && id != shard.read_id) abort();  // a forged lease borrowed
  const ShmArena& arena = *shard.store->arena();
  const uint8_t* begin = arena.data();
  const uint8_t* end = begin + arena.data_bytes();
  if (borrowed->blocks.size() != request->blocks.size()) abort();
  for (size_t i = 0; i < request->blocks.size(); ++i) {
    const std::span<uint8_t> b = borrowed->blocks[i];
    const fabric::KvBlockRef& ref = request->blocks[i];
    if (b.data() < begin || b.data() + b.size() > end ||
        static_cast<int64_t>(b.size()) != ref.length || arena.FileOffset(b.data()) != ref.offset) {
      abort();
    }
  }
  return 0;
}
