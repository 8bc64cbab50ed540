// Client of one cache-store shard over gRPC: puts and gets whole blocks, streaming them in
// chunks, or, for a shard on this machine that offers it, copying them through the shard's
// shared-memory arena (shm_client.h), falling back to the stream when that path is not
// available. Every call carries a deadline. Thread-safe (gRPC stubs are).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/store/block_data.h"
#include "common/store/shm_client.h"
#include "tandem/v1/cache_store.grpc.pb.h"

namespace tandem::store {

struct CacheStoreClientOptions {
  int64_t chunk_bytes = 1 << 20;  // data bytes per streamed message
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Try the shared-memory path first. Set it only for a shard on this machine
  // (IsLocalAddress); attaching proves it, and the stream is the fallback.
  bool shared_memory = false;
};

class CacheStoreClient {
 public:
  CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                   const CacheStoreClientOptions& options);
  // Streams only.
  CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                   int64_t chunk_bytes = 1 << 20,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // With a `reservation` (Reserve) that fits the blocks, one round trip through shared memory;
  // otherwise as without.
  absl::StatusOr<PutResult> Put(std::span<const BlockData> blocks,
                                ShmClient::Reservation* reservation = nullptr);
  // Space reserved now for blocks put later (ShmClient::Reserve); null unless the shared-memory
  // path is available.
  std::unique_ptr<ShmClient::Reservation> Reserve(std::span<const BlockSize> blocks);
  // One entry per hash, in order; nullopt for a block the shard does not hold. A block whose
  // bytes do not match its checksum is DataLoss. With `tiers`, also the tier each block was
  // found in (one entry per hash).
  absl::StatusOr<std::vector<std::optional<std::string>>> Get(
      std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers = nullptr);
  absl::StatusOr<std::vector<bool>> Exists(std::span<const uint64_t> hashes);
  absl::StatusOr<tandem::v1::StoreStats> Stats();

  // Whether the shared-memory path is mapped now (it attaches on the first Put or Get).
  bool shared_memory_attached() const { return shm_ != nullptr && shm_->attached(); }

 private:
  void SetDeadline(grpc::ClientContext& context) const;
  absl::StatusOr<PutResult> StreamPut(std::span<const BlockData> blocks);
  absl::StatusOr<std::vector<std::optional<std::string>>> StreamGet(
      std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers);

  std::unique_ptr<tandem::v1::CacheStore::Stub> stub_;
  const std::string model_id_;
  const int64_t chunk_bytes_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<ShmClient> shm_;  // null: streams only
};

}  // namespace tandem::store
