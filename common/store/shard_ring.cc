#include "common/store/shard_ring.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/check.h"

namespace tandem::store {
namespace {

// Block hashes are already uniform, but sequential test keys are not: mix them as well.
uint64_t Mix(uint64_t x) { return XXH3_64bits(&x, sizeof(x)); }

}  // namespace

ShardRing::ShardRing(std::vector<std::string> shards, int points_per_shard)
    : shards_(std::move(shards)) {
  points_.reserve(shards_.size() * points_per_shard);
  for (int s = 0; s < static_cast<int>(shards_.size()); ++s) {
    for (int p = 0; p < points_per_shard; ++p) {
      const std::string point = absl::StrCat(shards_[s], "#", p);
      points_.emplace_back(XXH3_64bits(point.data(), point.size()), s);
    }
  }
  std::sort(points_.begin(), points_.end());
}

int ShardRing::ShardFor(uint64_t block_hash) const {
  TANDEM_CHECK(!points_.empty(), "a shard ring with no shards");
  const uint64_t h = Mix(block_hash);
  auto it = std::lower_bound(points_.begin(), points_.end(), std::make_pair(h, 0));
  if (it == points_.end()) it = points_.begin();
  return it->second;
}

}  // namespace tandem::store
