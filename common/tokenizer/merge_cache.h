#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace tandem::tokenizer {

// Word -> BPE ids memo shared by every thread encoding with one tokenizer. Bounded: when it
// reaches `capacity` entries it is cleared, which keeps memory flat on adversarial input at
// the cost of re-merging the few hot words afterwards. Thread-safe (one absl::Mutex; readers
// share it).
class MergeCache {
 public:
  explicit MergeCache(size_t capacity) : capacity_(capacity) {}

  // Appends the cached ids of `word` to `out` and returns true on a hit.
  bool Lookup(std::string_view word, std::vector<int32_t>* out) const ABSL_LOCKS_EXCLUDED(mu_);
  void Insert(std::string_view word, const int32_t* ids, size_t n) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<int32_t>> map_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::tokenizer
