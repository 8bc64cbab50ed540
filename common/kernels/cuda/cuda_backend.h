#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/kernels/backend.h"

namespace tandem::kernels {

// The CUDA backend on device `ordinal`: weights and activations in device memory, GEMMs through
// cuBLASLt (bf16/fp16 tensor cores, f32 accumulation), the kernels of this folder on one stream.
// FailedPrecondition, with the CUDA runtime's reason, when there is no driver or no such device.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int ordinal);

// CUDA devices usable here: 0 without a driver or a GPU.
int CudaDeviceCount();

}  // namespace tandem::kernels
