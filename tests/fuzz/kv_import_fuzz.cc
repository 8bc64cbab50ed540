// libFuzzer target: the KV block transfer format, which decode workers will receive from the
// network. Any input must be rejected cleanly or imported whole, and a rejected input must
// leave the cache exactly as it was.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/kv/kv_cache_manager.h"
#include "common/kv/kv_transfer.h"

namespace {

// An fp16 cache, and a mixed-precision one (fp16 and int8 blocks) of the same geometry.
tandem::kv::KvCacheManager& Cache(bool mixed) {
  auto make = [](bool mixed) {
    tandem::kv::KvCacheOptions o;
    o.layout = {.num_layers = 2,
                .num_kv_heads = 2,
                .head_dim = 8,
                .block_size = 4,
                .dtype = tandem::DType::kF16};
    o.num_blocks = 8;
    if (mixed) o.mixed = {.narrow_blocks = 4, .sink_tokens = 4, .window_tokens = 4};
    o.model_id = "fuzz-model";
    return tandem::kv::KvCacheManager::Create(o).value().release();
  };
  static auto* plain = make(false);
  static auto* mixed_cache = make(true);
  return mixed ? *mixed_cache : *plain;
}

void ImportInto(tandem::kv::KvCacheManager& cache, const uint8_t* data, size_t size) {
  const tandem::kv::KvCacheStats before = cache.Stats();
  auto result = cache.Stats().total_blocks > 0
                    ? tandem::kv::ImportBlocks(
                          cache, std::string_view(reinterpret_cast<const char*>(data), size))
                    : absl::InternalError("no cache");
  const tandem::kv::KvCacheStats after = cache.Stats();
  if (after.free_blocks + after.used_blocks + after.cached_blocks != after.total_blocks) {
    __builtin_trap();
  }
  if (!result.ok() &&
      (after.used_blocks != before.used_blocks || after.cached_blocks != before.cached_blocks)) {
    __builtin_trap();
  }
  // Keep the cache from filling up so later inputs still exercise the import path.
  if (result.ok()) cache.ResetPrefixCache();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ImportInto(Cache(false), data, size);
  ImportInto(Cache(true), data, size);
  return 0;
}
