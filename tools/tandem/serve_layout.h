// What `tandem serve` runs in its one process: disaggregated (prefill and decode workers, KV
// handed over through the in-process store) or colocated (decode workers serving whole
// requests), and where each pool computes.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/config/config.h"
#include "common/kernels/backend_factory.h"

namespace tandem::cli {

struct ServeLayout {
  bool colocated = false;
  kernels::DeviceSpec prefill_device;  // unused when colocated
  kernels::DeviceSpec decode_device;
  std::string why;  // for the startup line
};

// Resolves serve.mode (auto: from the devices, see the rule in serve_layout.cc) and the devices
// (serve.prefill_device, serve.decode_device, else model.device). Deterministic in `config`;
// InvalidArgument for a device that is no device, or serve.mode disaggregated against
// router.mode colocated.
absl::StatusOr<ServeLayout> ChooseServeLayout(const config::TandemConfig& config);

}  // namespace tandem::cli
