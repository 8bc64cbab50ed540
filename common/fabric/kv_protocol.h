// The KV fabric's messages: UCX active messages between a worker and a cache-store shard that
// move the bytes of a run of blocks each, under a lease the shard handed out over gRPC
// (proto/tandem/v1/cache_store.proto, "fabric path").
//
// Two-sided on purpose. On transports without RDMA (tcp, sm) UCX emulates one-sided get and put
// in software and serves any address a peer names, registered or not (bench/ucx_rkey_scope.cc,
// docs/benchmarks.md), so a UCX remote key is no capability there. Here the shard checks every
// message against the lease's key and each block's exact region before a byte moves, and the
// bytes still land in, or leave from, the shard's registered arena without a copy (UCX
// rendezvous receives into it and sends from it, as one iovec of the blocks' regions).
//
//   put: kPut {lease, key, n, n × {index, offset, length}} + the blocks' bytes  ->  kPutDone
//   get: kGet {lease, key, n, n × {index, offset, length}}  ->  kGetDone + the blocks' bytes
//
// A request names up to kKvMaxBlocksPerMessage blocks (fewer where the transports' largest
// active-message header is smaller), its bytes the blocks' back to back. A reply carries the
// request's id and an absl status code; a refused message moves nothing, and a refused get
// carries no bytes; a request that is not well formed is refused with its id where its header
// has one. Both ends are little-endian hosts of the same layout (checked by the
// version word).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

namespace tandem::fabric {

enum KvAm : unsigned {
  kPut = 0x54,      // worker -> shard
  kGet = 0x55,      // worker -> shard
  kPutDone = 0x56,  // shard -> worker
  kGetDone = 0x57,  // shard -> worker
};

inline constexpr uint32_t kKvProtocolVersion = 0x544b5602;  // "TKV", 2

// A request's header starts with this; `count` KvBlockRefs follow it.
struct KvRequestHeader {
  uint32_t version = kKvProtocolVersion;
  uint32_t count = 0;       // blocks in this message
  uint64_t request_id = 0;  // the worker's; echoed in the reply
  uint64_t lease_id = 0;
  uint64_t key[2] = {0, 0};
};

// One block of a request: its position among the lease's reserved or found blocks and its
// region, as the lease's answer gave it.
struct KvBlockRef {
  uint32_t index = 0;
  uint32_t unused = 0;
  int64_t offset = 0;  // in the arena file
  int64_t length = 0;
};

struct KvReplyHeader {
  uint32_t version = kKvProtocolVersion;
  int32_t code = 0;  // absl::StatusCode
  uint64_t request_id = 0;
};

static_assert(std::is_trivially_copyable_v<KvRequestHeader> && sizeof(KvRequestHeader) == 40);
static_assert(std::is_trivially_copyable_v<KvBlockRef> && sizeof(KvBlockRef) == 24);
static_assert(std::is_trivially_copyable_v<KvReplyHeader> && sizeof(KvReplyHeader) == 16);

// Blocks one message names at most: bounds the header (3 KiB) and what one refusal covers.
inline constexpr uint32_t kKvMaxBlocksPerMessage = 128;

constexpr size_t KvHeaderBytes(uint32_t count) {
  return sizeof(KvRequestHeader) + size_t{count} * sizeof(KvBlockRef);
}

// A request's header, parsed.
struct KvRequest {
  KvRequestHeader header;
  std::vector<KvBlockRef> blocks;
  int64_t bytes = 0;  // the blocks' lengths summed
};

// The id of the request in a received header that is not well formed, so that the refusal
// reaches its caller at once: 0 where the header is too short or of another protocol (that
// sender then waits for its deadline).
inline uint64_t PeekKvRequestId(const void* data, size_t length) {
  KvRequestHeader h;
  if (length < sizeof h) return 0;
  std::memcpy(&h, data, sizeof h);
  return h.version == kKvProtocolVersion ? h.request_id : 0;
}

// The request in a received header, if it is one of this protocol's: the version, a count in
// [1, kKvMaxBlocksPerMessage] that matches the header's length, positive lengths.
inline std::optional<KvRequest> ParseKvRequest(const void* data, size_t length) {
  KvRequest r;
  if (length < sizeof r.header) return std::nullopt;
  std::memcpy(&r.header, data, sizeof r.header);
  if (r.header.version != kKvProtocolVersion || r.header.count == 0 ||
      r.header.count > kKvMaxBlocksPerMessage || length != KvHeaderBytes(r.header.count)) {
    return std::nullopt;
  }
  r.blocks.resize(r.header.count);
  std::memcpy(r.blocks.data(), static_cast<const char*>(data) + sizeof r.header,
              r.blocks.size() * sizeof(KvBlockRef));
  constexpr int64_t kMaxBytes = int64_t{1} << 48;  // far past any arena; no sum overflows
  for (const KvBlockRef& b : r.blocks) {
    if (b.length <= 0 || b.length > kMaxBytes) return std::nullopt;
    r.bytes += b.length;
  }
  return r;
}

}  // namespace tandem::fabric
