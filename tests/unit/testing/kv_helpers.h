// Helpers the KV cache, engine and worker tests share: a cache from options, and token
// sequences.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "common/kv/kv_cache_manager.h"

namespace tandem::testing {

// A KV cache manager from `options` (a test failure if they are refused).
inline std::unique_ptr<kv::KvCacheManager> MakeKvCache(const kv::KvCacheOptions& options) {
  auto m = kv::KvCacheManager::Create(options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Tokens start, start+1, ..., start+n-1.
inline std::vector<int32_t> Iota(int n, int32_t start) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// `len` tokens drawn from [0, vocab) by a generator seeded with `seed`.
inline std::vector<int32_t> RandomTokens(int len, uint32_t seed, int vocab = 128) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(len);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

}  // namespace tandem::testing
