#include "common/store/store_pool.h"

#include <grpcpp/grpcpp.h>

#include "common/store/shm_mapping.h"

namespace tandem::store {

StorePool::StorePool(std::vector<std::string> shard_addresses, std::string model_id,
                     const StorePoolOptions& options)
    : ring_(std::move(shard_addresses)) {
  for (const std::string& address : ring_.shards()) {
    clients_.push_back(std::make_unique<CacheStoreClient>(
        grpc::CreateChannel(address,
                            options.transport->ChannelCredentials(security::Role::kCacheStore)),
        model_id,
        CacheStoreClientOptions{
            .chunk_bytes = options.chunk_bytes,
            .timeout = options.timeout,
            .shared_memory = options.shared_memory && IsLocalAddress(address),
        }));
  }
}

StorePool::PutReport StorePool::Put(std::span<const BlockData> blocks) {
  PutReport report;
  report.stored.assign(blocks.size(), false);
  if (ring_.empty()) return report;
  std::vector<std::vector<size_t>> by_shard(clients_.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    by_shard[ring_.ShardFor(blocks[i].hash)].push_back(i);
  }
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::vector<uint64_t> hashes;
    for (size_t i : by_shard[s]) hashes.push_back(blocks[i].hash);
    absl::StatusOr<std::vector<bool>> present = clients_[s]->Exists(hashes);
    if (!present.ok()) continue;  // shard down: these blocks stay unstored
    std::vector<BlockData> missing;
    std::vector<size_t> missing_index;
    for (size_t j = 0; j < by_shard[s].size(); ++j) {
      if ((*present)[j]) {
        report.stored[by_shard[s][j]] = true;
      } else {
        missing.push_back(blocks[by_shard[s][j]]);
        missing_index.push_back(by_shard[s][j]);
      }
    }
    if (missing.empty()) continue;
    if (!clients_[s]->Put(missing).ok()) continue;
    for (size_t k = 0; k < missing.size(); ++k) {
      report.stored[missing_index[k]] = true;
      report.bytes += static_cast<int64_t>(missing[k].bytes.size());
    }
    report.uploaded += static_cast<int>(missing.size());
  }
  return report;
}

std::vector<std::optional<std::string>> StorePool::Get(std::span<const uint64_t> hashes) {
  std::vector<std::optional<std::string>> out(hashes.size());
  if (ring_.empty()) return out;
  std::vector<std::vector<size_t>> by_shard(clients_.size());
  for (size_t i = 0; i < hashes.size(); ++i) by_shard[ring_.ShardFor(hashes[i])].push_back(i);
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::vector<uint64_t> keys;
    for (size_t i : by_shard[s]) keys.push_back(hashes[i]);
    auto got = clients_[s]->Get(keys);
    if (!got.ok()) continue;  // shard down: absent
    for (size_t j = 0; j < keys.size(); ++j) out[by_shard[s][j]] = std::move((*got)[j]);
  }
  return out;
}

}  // namespace tandem::store
