// Randomized engine simulation against a simple model of the expected refcounts. The simulated
// engine writes each token id into its position's K row, so a prefix hit that maps a block with
// the wrong contents (e.g. a stale index entry after eviction) is caught.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/kv/kv_cache_manager.h"

namespace tandem::kv {
namespace {

constexpr int kBs = 4;
constexpr int64_t kNumBlocks = 24;

struct SimSeq {
  std::vector<int32_t> tokens;
};

class Simulation {
 public:
  explicit Simulation(uint32_t seed) : rng_(seed) {
    KvCacheOptions o;
    o.layout = KvLayout{
        .num_layers = 1, .num_kv_heads = 1, .head_dim = 2, .block_size = kBs, .dtype = DType::kF32};
    o.num_blocks = kNumBlocks;
    o.model_id = "sim";
    m_ = std::move(KvCacheManager::Create(o)).value();
    for (int p = 0; p < 3; ++p) {
      for (int i = 0; i < 12; ++i) bases_[p].push_back(static_cast<int32_t>(Uniform(0, 3)));
    }
  }

  // What a run exercised, so the test can insist that it covered the interesting paths.
  struct Coverage {
    int64_t hits = 0;
    int64_t evictions = 0;
    int64_t failed_reserves = 0;
  };
  const Coverage& coverage() const { return totals_; }

  void Run(int steps) {
    for (int step = 0; step < steps; ++step) {
      const int op = Uniform(0, 99);
      if (op < 30) {
        Add();
      } else if (op < 70) {
        Decode();
      } else if (op < 97) {
        Free();
      } else {
        m_->ResetPrefixCache();
      }
      CheckInvariants();
      if (::testing::Test::HasFatalFailure()) return;
    }
    totals_.hits = m_->Stats().hits;
    totals_.evictions = m_->Stats().evictions;
    for (auto& [id, seq] : seqs_) m_->FreeSequence(id);
    seqs_.clear();
    CheckInvariants();
    EXPECT_EQ(m_->Stats().used_blocks, 0);
  }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // Token at position `pos` as the simulated engine wrote it into `block`.
  int32_t Stored(int32_t block, int pos) const {
    int32_t v;
    const KvLayout& l = m_->layout();
    std::memcpy(&v, m_->pool_base() + block * l.BlockBytes() + l.KOffset(0, 0) + pos * 8, 4);
    return v;
  }

  void Write(const std::vector<int32_t>& table, const std::vector<int32_t>& tokens, int from,
             int to) {
    const KvLayout& l = m_->layout();
    for (int p = from; p < to; ++p) {
      const int32_t block = table[p / kBs];
      // The engine only writes blocks it owns alone; shared blocks are committed, read-only.
      ASSERT_EQ(m_->BlockRefCount(block), 1) << "writing a shared block";
      std::memcpy(m_->pool_base() + block * l.BlockBytes() + l.KOffset(0, 0) + (p % kBs) * 8,
                  &tokens[p], 4);
    }
  }

  void Add() {
    const int64_t id = next_id_++;
    std::vector<int32_t> prompt(bases_[Uniform(0, 2)]);
    prompt.resize(Uniform(0, 12));
    for (int n = Uniform(prompt.empty() ? 1 : 0, 6); n > 0; --n) prompt.push_back(Uniform(0, 3));
    const KvCacheStats before = m_->Stats();
    auto cached = m_->AddSequence(id, prompt);
    ASSERT_TRUE(cached.ok()) << cached.status();
    const int max_blocks = static_cast<int>((prompt.size() - 1) / kBs);
    const int hit_blocks = *cached / kBs;
    ASSERT_EQ(*cached % kBs, 0);
    ASSERT_LE(hit_blocks, max_blocks);
    ASSERT_EQ(m_->Stats().hits, before.hits + hit_blocks);
    ASSERT_EQ(m_->Stats().misses, before.misses + (hit_blocks < max_blocks ? 1 : 0));
    const std::vector<int32_t> table = m_->BlockTable(id);
    ASSERT_EQ(static_cast<int>(table.size()), hit_blocks);
    for (int p = 0; p < *cached; ++p) {
      ASSERT_EQ(Stored(table[p / kBs], p % kBs), prompt[p]) << "prefix hit with wrong contents";
    }
    seqs_[id].tokens = prompt;  // registered from here on, even if the reservation fails
    if (!ReserveOrCheckUnchanged(id, static_cast<int>(prompt.size()))) {
      m_->FreeSequence(id);  // an engine would preempt; the simulation just drops it
      seqs_.erase(id);
      return;
    }
    Write(m_->BlockTable(id), prompt, *cached, static_cast<int>(prompt.size()));
    m_->CommitTokens(id, prompt, static_cast<int>(prompt.size()));
  }

  void Decode() {
    if (seqs_.empty()) return;
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    std::vector<int32_t>& tokens = it->second.tokens;
    tokens.push_back(Uniform(0, 3));
    if (!ReserveOrCheckUnchanged(it->first, static_cast<int>(tokens.size()))) {
      tokens.pop_back();
      return;
    }
    const int n = static_cast<int>(tokens.size());
    Write(m_->BlockTable(it->first), tokens, n - 1, n);
    m_->CommitTokens(it->first, tokens, n);
  }

  void Free() {
    if (seqs_.empty()) return;
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    m_->FreeSequence(it->first);
    seqs_.erase(it);
  }

  // Returns true on success; on ResourceExhausted checks that nothing changed.
  bool ReserveOrCheckUnchanged(int64_t id, int num_tokens) {
    const KvCacheStats before = m_->Stats();
    const std::vector<int32_t> table = m_->BlockTable(id);
    const absl::Status s = m_->Reserve(id, num_tokens);
    if (s.ok()) {
      EXPECT_EQ(m_->NumBlocks(id), (num_tokens + kBs - 1) / kBs);
      return true;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    ++totals_.failed_reserves;
    const KvCacheStats after = m_->Stats();
    EXPECT_EQ(after.free_blocks, before.free_blocks);
    EXPECT_EQ(after.cached_blocks, before.cached_blocks);
    EXPECT_EQ(after.evictions, before.evictions);
    EXPECT_EQ(m_->BlockTable(id), table);
    EXPECT_LT(m_->NumAvailableBlocks(), (num_tokens + kBs - 1) / kBs - int64_t(table.size()));
    return false;
  }

  void CheckInvariants() {
    const KvCacheStats s = m_->Stats();
    ASSERT_EQ(s.free_blocks + s.used_blocks + s.cached_blocks, s.total_blocks);
    ASSERT_EQ(s.num_sequences, static_cast<int64_t>(seqs_.size()));
    absl::flat_hash_map<int32_t, int> expected;  // block -> number of tables holding it
    for (const auto& [id, seq] : seqs_) {
      const std::vector<int32_t> table = m_->BlockTable(id);
      ASSERT_EQ(static_cast<int>(table.size()),
                (static_cast<int>(seq.tokens.size()) + kBs - 1) / kBs);
      absl::flat_hash_map<int32_t, int> once;
      for (int32_t b : table) {
        ASSERT_EQ(++once[b], 1) << "block twice in one table";
        ++expected[b];
      }
    }
    ASSERT_EQ(s.used_blocks, static_cast<int64_t>(expected.size()));
    for (int32_t b = 0; b < kNumBlocks; ++b) {
      auto it = expected.find(b);
      ASSERT_EQ(m_->BlockRefCount(b), it == expected.end() ? 0 : it->second) << "block " << b;
    }
    ASSERT_EQ(m_->NumAvailableBlocks(), s.free_blocks + s.cached_blocks);
  }

  std::mt19937 rng_;
  std::unique_ptr<KvCacheManager> m_;
  std::vector<int32_t> bases_[3];
  std::map<int64_t, SimSeq> seqs_;
  int64_t next_id_ = 0;
  Coverage totals_;
};

TEST(KvCacheRandomTest, InvariantsHoldUnderRandomOperations) {
  Simulation::Coverage total;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    Simulation sim(seed);
    sim.Run(2000);
    if (HasFatalFailure()) return;
    total.hits += sim.coverage().hits;
    total.evictions += sim.coverage().evictions;
    total.failed_reserves += sim.coverage().failed_reserves;
  }
  EXPECT_GT(total.hits, 1000);
  EXPECT_GT(total.evictions, 1000);
  EXPECT_GT(total.failed_reserves, 100);
  std::printf("hits=%ld evictions=%ld failed_reserves=%ld\n", static_cast<long>(total.hits),
              static_cast<long>(total.evictions), static_cast<long>(total.failed_reserves));
}

}  // namespace
}  // namespace tandem::kv
