#include "common/kv/kv_eviction.h"

#include <algorithm>
#include <cmath>

#include "common/kv/kv_rows.h"

namespace tandem::kv {
namespace {

double CosineDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double{a[i]} * b[i];
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
  }
  if (aa == 0 || bb == 0) return aa == bb ? 0.0 : 1.0;
  return 1.0 - ab / std::sqrt(aa * bb);
}

}  // namespace

std::vector<float> SequenceEviction::ChunkMeanKey(const KvCacheManager& kv,
                                                  const std::vector<int32_t>& table, int first,
                                                  int count) const {
  const KvArena& arena = kv.arena();
  const KvLayout& l = arena.layout;
  const int layer = l.num_layers / 2;
  std::vector<float> mean(static_cast<size_t>(l.num_kv_heads) * l.head_dim, 0.0f);
  std::vector<float> row(l.head_dim);
  std::vector<uint8_t> scratch;  // a block in device memory, copied out
  int rows = 0;
  for (int b = first; b < first + count; ++b) {
    if (table[b] == kNoBlock) continue;
    const uint8_t* block = kv.ReadableBlock(table[b], scratch);
    for (int slot = 0; slot < l.block_size; ++slot, ++rows) {
      for (int head = 0; head < l.num_kv_heads; ++head) {
        ReadKvRow(block, arena.LayoutOf(table[b]), {layer, head, false, slot}, row.data());
        for (int i = 0; i < l.head_dim; ++i) mean[head * l.head_dim + i] += row[i];
      }
    }
  }
  if (rows > 0) {
    for (float& x : mean) x /= static_cast<float>(rows);
  }
  return mean;
}

void SequenceEviction::DetectShifts(const KvCacheManager& kv, const std::vector<int32_t>& table,
                                    int full_blocks) {
  const int chunk = std::max(1, policy_.chunk_tokens / kv.layout().block_size);
  for (; (chunks_seen_ + 1) * chunk <= full_blocks; ++chunks_seen_) {
    const int first = chunks_seen_ * chunk;
    std::vector<float> mean = ChunkMeanKey(kv, table, first, chunk);
    if (!last_mean_.empty()) {
      const double d = CosineDistance(last_mean_, mean);
      // A shift needs a few distances to stand out from.
      if (distances_ >= 4) {
        const double sd = std::sqrt(distance_m2_ / static_cast<double>(distances_ - 1));
        if (d > distance_mean_ + policy_.shift_threshold * sd) segment_starts_.push_back(first);
      }
      ++distances_;
      const double delta = d - distance_mean_;
      distance_mean_ += delta / static_cast<double>(distances_);
      distance_m2_ += delta * (d - distance_mean_);
    }
    last_mean_ = std::move(mean);
  }
}

int SequenceEviction::Apply(KvCacheManager& kv, int64_t seq_id, int num_computed) {
  if (policy_.budget_tokens <= 0) return 0;
  const int bs = kv.layout().block_size;
  const std::vector<int32_t> table = kv.BlockTable(seq_id);
  const int full = std::min(num_computed / bs, static_cast<int>(table.size()));
  // Chunks are measured once, as they fill and before anything in them can be evicted.
  if (policy_.semantic) DetectShifts(kv, table, full);
  const int sinks = (policy_.sink_tokens + bs - 1) / bs;
  const int keep = std::max(1, policy_.budget_tokens / bs - sinks);
  const int from = std::max(sinks, evicted_to_);
  // Sliding: just enough of the oldest blocks; only full blocks go.
  int to = std::min(full, static_cast<int>(table.size()) - keep);
  if (to <= from) return 0;
  if (policy_.semantic) {
    // The first segment start at or past the sliding cut, keeping at least half the budget.
    const int latest = std::min(full, static_cast<int>(table.size()) - std::max(1, keep / 2));
    for (int start : segment_starts_) {
      if (start >= to && start <= latest) {
        to = start;
        break;
      }
    }
  }
  const int evicted = kv.EvictBlocks(seq_id, from, to);
  evicted_to_ = to;
  return evicted;
}

}  // namespace tandem::kv
