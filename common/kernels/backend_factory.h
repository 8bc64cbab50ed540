#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/kernels/backend.h"
#include "common/util/thread_pool.h"

namespace tandem::kernels {

// Where a model computes: `model.device` in the config ("cpu", "cuda", "cuda:N").
struct DeviceSpec {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the CUDA device ordinal

  std::string ToString() const;
  bool operator==(const DeviceSpec&) const = default;
};

// InvalidArgument, naming what is accepted, for anything but cpu, cuda and cuda:N.
absl::StatusOr<DeviceSpec> ParseDevice(std::string_view text);

// True when this binary was built with the CUDA backend (TANDEM_CUDA found nvcc).
bool CudaBackendBuilt();

// The backend for `device`. CPU kernels run on `pool`. For CUDA: FailedPrecondition when the
// binary was built without it, or when no usable device is there (no driver, no GPU, an ordinal
// past the last), with the reason the CUDA runtime gives.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const DeviceSpec& device, ThreadPool& pool);

}  // namespace tandem::kernels
