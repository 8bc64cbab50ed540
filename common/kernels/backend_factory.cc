#include "common/kernels/backend_factory.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "common/kernels/cpu/cpu_backend.h"
#if TANDEM_HAVE_CUDA
#include "common/kernels/cuda/cuda_backend.h"
#endif

namespace tandem::kernels {

std::string DeviceSpec::ToString() const {
  return kind == Kind::kCpu ? "cpu" : absl::StrCat("cuda:", index);
}

absl::StatusOr<DeviceSpec> ParseDevice(std::string_view text) {
  if (text == "cpu") return DeviceSpec{};
  if (text == "cuda") return DeviceSpec{.kind = DeviceSpec::Kind::kCuda};
  constexpr std::string_view kCudaPrefix = "cuda:";
  if (text.substr(0, kCudaPrefix.size()) == kCudaPrefix) {
    const std::string_view digits = text.substr(kCudaPrefix.size());
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() &&
        index >= 0 && index < 1024) {
      return DeviceSpec{.kind = DeviceSpec::Kind::kCuda, .index = index};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device \"", std::string(text), "\": expected cpu, cuda or cuda:N (N a device ordinal)"));
}

bool CudaBackendBuilt() { return TANDEM_HAVE_CUDA != 0; }

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const DeviceSpec& device, ThreadPool& pool) {
  if (device.kind == DeviceSpec::Kind::kCpu) return std::make_unique<CpuBackend>(pool);
#if TANDEM_HAVE_CUDA
  return CreateCudaBackend(device.index);
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "model.device ", device.ToString(),
      ": this binary was built without the CUDA backend (configure with -DTANDEM_CUDA=ON on a "
      "machine with the CUDA toolkit)"));
#endif
}

}  // namespace tandem::kernels
