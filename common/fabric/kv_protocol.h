// The KV fabric's messages: UCX active messages between a worker and a cache-store shard that
// move the bytes of one block each, under a lease the shard handed out over gRPC
// (proto/tandem/v1/cache_store.proto, "fabric path").
//
// Two-sided on purpose. On transports without RDMA (tcp, sm) UCX emulates one-sided get and put
// in software and serves any address a peer names, registered or not (bench/ucx_rkey_scope.cc,
// docs/benchmarks.md), so a UCX remote key is no capability there. Here the shard checks every
// message against the lease's key and the block's exact region before a byte moves, and the
// bytes still land in, or leave from, the shard's registered arena without a copy (UCX
// rendezvous receives into it and sends from it).
//
//   put: kPutBlock {lease, key, index, offset, length} + the block's bytes  ->  kPutDone
//   get: kGetBlock {lease, key, index, offset, length}  ->  kGetDone + the block's bytes
//
// A reply carries the request's id and an absl status code; a refused get carries no bytes.
// Both ends are little-endian hosts of the same layout (checked by the version word).
#pragma once

#include <cstdint>
#include <type_traits>

namespace tandem::fabric {

enum KvAm : unsigned {
  kPutBlock = 0x54,  // worker -> shard
  kGetBlock = 0x55,  // worker -> shard
  kPutDone = 0x56,   // shard -> worker
  kGetDone = 0x57,   // shard -> worker
};

inline constexpr uint32_t kKvProtocolVersion = 0x544b5601;  // "TKV", 1

struct KvRequestHeader {
  uint32_t version = kKvProtocolVersion;
  uint32_t index = 0;       // the block's position among the lease's reserved or found blocks
  uint64_t request_id = 0;  // the worker's; echoed in the reply
  uint64_t lease_id = 0;
  uint64_t key[2] = {0, 0};
  int64_t offset = 0;  // in the arena file, as the lease's answer gave it
  int64_t length = 0;
};

struct KvReplyHeader {
  uint32_t version = kKvProtocolVersion;
  int32_t code = 0;  // absl::StatusCode
  uint64_t request_id = 0;
};

static_assert(std::is_trivially_copyable_v<KvRequestHeader> && sizeof(KvRequestHeader) == 56);
static_assert(std::is_trivially_copyable_v<KvReplyHeader> && sizeof(KvReplyHeader) == 16);

}  // namespace tandem::fabric
