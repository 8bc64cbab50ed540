// Client of one cache-store shard over gRPC: puts and gets whole blocks, streaming them in
// chunks. Every call carries a deadline. Thread-safe (gRPC stubs are).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/cache_store.grpc.pb.h"

namespace tandem::store {

struct BlockData {
  uint64_t hash = 0;
  std::string bytes;
};

struct PutResult {
  int stored = 0;
  int skipped = 0;  // already held by the shard
};

class CacheStoreClient {
 public:
  CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                   int64_t chunk_bytes = 1 << 20,
                   std::chrono::milliseconds timeout = std::chrono::seconds(30));

  absl::StatusOr<PutResult> Put(std::span<const BlockData> blocks);
  // One entry per hash, in order; nullopt for a block the shard does not hold. A block whose
  // bytes do not match its checksum is DataLoss.
  absl::StatusOr<std::vector<std::optional<std::string>>> Get(std::span<const uint64_t> hashes);
  absl::StatusOr<std::vector<bool>> Exists(std::span<const uint64_t> hashes);
  absl::StatusOr<tandem::v1::StoreStats> Stats();

 private:
  void SetDeadline(grpc::ClientContext& context) const;

  std::unique_ptr<tandem::v1::CacheStore::Stub> stub_;
  const std::string model_id_;
  const int64_t chunk_bytes_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace tandem::store
