// Client of one cache-store shard: puts and gets whole blocks through the first transport that
// is available, in this order: the shard's shared-memory arena (a shard on this machine), the
// KV fabric (UCX), the gRPC stream, which always is (arena_client.h says when the others are
// not). Every call carries a deadline. Thread-safe (gRPC stubs are).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/store/arena_client.h"
#include "common/store/block_data.h"
#include "tandem/v1/cache_store.grpc.pb.h"

namespace tandem::store {

struct CacheStoreClientOptions {
  int64_t chunk_bytes = 1 << 20;  // data bytes per streamed message
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Try the shared-memory path first. Set it only for a shard on this machine
  // (IsLocalAddress); attaching proves it, and the stream is the fallback.
  bool shared_memory = false;
  // Then the KV fabric (UCX), where the shard offers it, through `fabric_client` (null: the
  // process's, UcxKvClient::Shared).
  bool fabric = false;
  std::shared_ptr<class UcxKvClient> fabric_client = nullptr;
  // Told of every Put and Get that moved bytes, after it ended (metrics); any thread.
  std::function<void(const struct TransferSample&)> on_transfer = nullptr;
};

// One Put or Get as the transport that carried it saw it.
struct TransferSample {
  const char* transport = "grpc";  // "grpc", "shm", "ucx"
  bool put = false;
  bool ok = true;
  int blocks = 0;
  int64_t bytes = 0;
  double seconds = 0;
};

class CacheStoreClient {
 public:
  using GetResult = absl::StatusOr<std::vector<std::optional<std::string>>>;
  CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                   const CacheStoreClientOptions& options);
  // Streams only.
  CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                   int64_t chunk_bytes = 1 << 20,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // With a `reservation` (Reserve) that fits the blocks, one round trip through shared memory;
  // otherwise as without.
  absl::StatusOr<PutResult> Put(std::span<const BlockData> blocks,
                                ArenaClient::Reservation* reservation = nullptr);
  // Space reserved now for blocks put later (ArenaClient::Reserve); null unless the shared-memory
  // path is available.
  std::unique_ptr<ArenaClient::Reservation> Reserve(std::span<const BlockSize> blocks);
  // One entry per hash, in order; nullopt for a block the shard does not hold. A block whose
  // bytes do not match its checksum is DataLoss. With `tiers`, also the tier each block was
  // found in (one entry per hash).
  absl::StatusOr<std::vector<std::optional<std::string>>> Get(
      std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers = nullptr);
  absl::StatusOr<std::vector<bool>> Exists(std::span<const uint64_t> hashes);
  absl::StatusOr<tandem::v1::StoreStats> Stats();

  // Readies the shard's first transfer now (a worker starting): connects the channel and
  // attaches the first arena path that is available (ArenaClient::Connect). Waits for the
  // attach, at most a few seconds; a shard not up yet is left to the first Put or Get.
  void Connect();

  // Whether the shared-memory path is mapped now (it attaches on the first Put or Get, or at
  // Connect).
  bool shared_memory_attached() const { return Attached(ArenaTransport::kSharedMemory); }
  // Whether the fabric path is attached now.
  bool fabric_attached() const { return Attached(ArenaTransport::kFabric); }

 private:
  void SetDeadline(grpc::ClientContext& context) const;
  bool Attached(ArenaTransport transport) const;
  void Report(const TransferSample& sample) const;
  absl::StatusOr<PutResult> StreamPut(std::span<const BlockData> blocks);
  absl::StatusOr<std::vector<std::optional<std::string>>> StreamGet(
      std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers);

  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::CacheStore::Stub> stub_;
  const std::string model_id_;
  const int64_t chunk_bytes_;
  const std::chrono::milliseconds timeout_;
  // The arena paths to try before the stream, in order.
  std::vector<std::unique_ptr<ArenaClient>> arenas_;
  const std::function<void(const TransferSample&)> on_transfer_;
};

}  // namespace tandem::store
