#include "tools/make_random_model/random_fill.h"

#include <algorithm>
#include <cmath>

namespace tandem::make_random_model {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna).
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& w : s_) w = SplitMix64(seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Approximately N(0,1): the sum of four 16-bit uniforms (Irwin-Hall, bounded at +-3.46),
// rescaled to unit variance. One PRNG call per sample keeps the 1B preset fast.
inline float Normal(Xoshiro256& rng) {
  const uint64_t r = rng.Next();
  const int64_t sum =
      static_cast<int64_t>(r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
  constexpr double kScale = 1.7320508075688772 / 65536.0;  // sqrt(3) / 2^16
  return static_cast<float>((sum - 2 * 65535) * kScale);
}

}  // namespace

uint64_t TensorSeed(uint64_t model_seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  uint64_t state = model_seed ^ h;
  return SplitMix64(state);
}

void FillBlocks(InitKind kind, double std, uint64_t tensor_seed, int64_t first_block, int64_t n,
                float* out) {
  float scale = static_cast<float>(std);
  float offset = 0.0f;
  if (kind == InitKind::kNorm) {
    scale = static_cast<float>(kNormNoise);
    offset = 1.0f;
  } else if (kind == InitKind::kBias) {
    scale = static_cast<float>(kBiasStd);
  }
  for (int64_t done = 0, block = first_block; done < n; ++block) {
    uint64_t state = tensor_seed + static_cast<uint64_t>(block) * 0xd1b54a32d192ed03ull;
    Xoshiro256 rng(SplitMix64(state));
    const int64_t len = std::min(kFillBlock, n - done);
    for (int64_t i = 0; i < len; ++i) out[done + i] = offset + scale * Normal(rng);
    done += len;
  }
}

}  // namespace tandem::make_random_model
