#include "common/store/store_pool.h"

#include <grpcpp/grpcpp.h>

#include "common/store/shm_mapping.h"

namespace tandem::store {

StorePool::StorePool(std::vector<std::string> shard_addresses, std::string model_id,
                     const StorePoolOptions& options)
    : ring_(std::move(shard_addresses)) {
  for (const std::string& address : ring_.shards()) {
    const bool local = IsLocalAddress(address);
    clients_.push_back(std::make_unique<CacheStoreClient>(
        grpc::CreateChannel(address,
                            options.transport->ChannelCredentials(security::Role::kCacheStore)),
        model_id,
        CacheStoreClientOptions{
            .chunk_bytes = options.chunk_bytes,
            .timeout = options.timeout,
            .shared_memory = options.shared_memory && local,
            .fabric = options.fabric == FabricUse::kEveryShard ||
                      (options.fabric == FabricUse::kRemoteShards && !local),
            .on_transfer = options.on_transfer,
        }));
  }
}

StorePool::~StorePool() {
  if (connector_.joinable()) connector_.join();
}

void StorePool::ConnectInBackground() {
  if (connector_.joinable()) return;  // connecting already
  connector_ = std::thread([this] {
    for (const auto& client : clients_) client->Connect();
  });
}

int64_t StorePool::Reservation::reserved_bytes() const {
  int64_t bytes = 0;
  for (const auto& r : by_shard_) bytes += r != nullptr ? r->reserved_bytes() : 0;
  return bytes;
}

std::vector<std::vector<size_t>> StorePool::ByShard(size_t n,
                                                    const std::function<uint64_t(size_t)>& hash) {
  std::vector<std::vector<size_t>> by_shard(clients_.size());
  for (size_t i = 0; i < n; ++i) by_shard[ring_.ShardFor(hash(i))].push_back(i);
  return by_shard;
}

std::unique_ptr<StorePool::Reservation> StorePool::Reserve(std::span<const BlockSize> blocks) {
  auto reservation = std::make_unique<Reservation>();
  reservation->by_shard_.resize(clients_.size());
  const auto by_shard = ByShard(blocks.size(), [&](size_t i) { return blocks[i].hash; });
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::vector<BlockSize> shard_blocks;
    for (size_t i : by_shard[s]) shard_blocks.push_back(blocks[i]);
    reservation->by_shard_[s] = clients_[s]->Reserve(shard_blocks);
  }
  return reservation;
}

StorePool::PutReport StorePool::Put(std::span<const BlockData> blocks, Reservation* reservation) {
  PutReport report;
  report.stored.assign(blocks.size(), false);
  if (ring_.empty()) return report;
  const auto by_shard = ByShard(blocks.size(), [&](size_t i) { return blocks[i].hash; });
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].empty()) continue;
    ArenaClient::Reservation* reserved = reservation != nullptr && s < reservation->by_shard_.size()
                                             ? reservation->by_shard_[s].get()
                                             : nullptr;
    std::vector<BlockData> send;
    std::vector<size_t> send_index;
    if (reserved != nullptr || clients_[s]->shared_memory_attached()) {
      // A reservation (or the Reserve of a shared-memory put) skips the blocks the shard holds.
      send_index = by_shard[s];
    } else {
      std::vector<uint64_t> hashes;
      for (size_t i : by_shard[s]) hashes.push_back(blocks[i].hash);
      absl::StatusOr<std::vector<bool>> present = clients_[s]->Exists(hashes);
      if (!present.ok()) continue;  // shard down: these blocks stay unstored
      for (size_t j = 0; j < by_shard[s].size(); ++j) {
        if ((*present)[j]) {
          report.stored[by_shard[s][j]] = true;
        } else {
          send_index.push_back(by_shard[s][j]);
        }
      }
    }
    if (send_index.empty()) continue;
    // Every block, in order (one shard, none held): sent as they are, without a copy.
    const bool all = send_index.size() == blocks.size();
    if (!all) {
      for (size_t i : send_index) send.push_back(blocks[i]);
    }
    absl::StatusOr<PutResult> put = clients_[s]->Put(all ? blocks : send, reserved);
    if (!put.ok()) continue;
    for (size_t i : send_index) report.stored[i] = true;
    report.bytes += put->bytes;
    report.ahead += put->ahead ? 1 : 0;
    report.uploaded += static_cast<int>(send_index.size()) - put->skipped;
  }
  return report;
}

std::vector<std::optional<std::string>> StorePool::Get(std::span<const uint64_t> hashes,
                                                       std::vector<StoreTier>* tiers) {
  std::vector<std::optional<std::string>> out(hashes.size());
  if (tiers != nullptr) tiers->assign(hashes.size(), StoreTier::kNone);
  if (ring_.empty()) return out;
  const auto by_shard = ByShard(hashes.size(), [&](size_t i) { return hashes[i]; });
  for (size_t s = 0; s < by_shard.size(); ++s) {
    if (by_shard[s].empty()) continue;
    std::vector<uint64_t> keys;
    for (size_t i : by_shard[s]) keys.push_back(hashes[i]);
    std::vector<StoreTier> found_in;
    auto got = clients_[s]->Get(keys, tiers != nullptr ? &found_in : nullptr);
    if (!got.ok()) continue;  // shard down: absent
    for (size_t j = 0; j < keys.size(); ++j) {
      out[by_shard[s][j]] = std::move((*got)[j]);
      if (tiers != nullptr) (*tiers)[by_shard[s][j]] = found_in[j];
    }
  }
  return out;
}

}  // namespace tandem::store
