#include "common/util/process_tuning.h"

#include <malloc.h>

#include "absl/synchronization/mutex.h"

namespace tandem {

void TuneServingProcess() {
  // Both fixed values also stop glibc's dynamic threshold from drifting.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: smaller buffers come from the heap
  mallopt(M_TRIM_THRESHOLD, 256 << 20);  // trim only past 256 MiB of free heap
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace tandem
