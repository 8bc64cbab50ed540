#include "common/kernels/backend.h"

namespace tandem::kernels {

absl::Status BackendBuffer::Reserve(Backend& backend, size_t count) {
  if (count <= size_ && backend_ == &backend) return absl::OkStatus();
  Release();
  absl::StatusOr<void*> p = backend.Allocate(count * sizeof(float));
  if (!p.ok()) return p.status();
  backend_ = &backend;
  data_ = static_cast<float*>(*p);
  size_ = count;
  return absl::OkStatus();
}

void BackendBuffer::Release() {
  if (backend_ != nullptr && data_ != nullptr) backend_->Free(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tandem::kernels
