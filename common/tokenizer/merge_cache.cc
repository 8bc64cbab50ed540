#include "common/tokenizer/merge_cache.h"

#include "absl/strings/string_view.h"

namespace tandem::tokenizer {

bool MergeCache::Lookup(std::string_view word, std::vector<int32_t>* out) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = map_.find(absl::string_view(word.data(), word.size()));
  if (it == map_.end()) return false;
  out->insert(out->end(), it->second.begin(), it->second.end());
  return true;
}

void MergeCache::Insert(std::string_view word, const int32_t* ids, size_t n) {
  absl::MutexLock lock(&mu_);
  if (map_.size() >= capacity_) map_.clear();
  map_.try_emplace(std::string(word), ids, ids + n);
}

}  // namespace tandem::tokenizer
