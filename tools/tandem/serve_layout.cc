#include "tools/tandem/serve_layout.h"

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tandem::cli {
namespace {

absl::StatusOr<kernels::DeviceSpec> DeviceOf(const std::string& role_device,
                                             const std::string& model_device) {
  return kernels::ParseDevice(role_device.empty() ? model_device : role_device);
}

}  // namespace

absl::StatusOr<ServeLayout> ChooseServeLayout(const config::TandemConfig& c) {
  ServeLayout layout;
  TANDEM_ASSIGN_OR_RETURN(layout.prefill_device, DeviceOf(c.serve.prefill_device, c.model.device));
  TANDEM_ASSIGN_OR_RETURN(layout.decode_device, DeviceOf(c.serve.decode_device, c.model.device));
  const bool router_colocated = c.router.mode == "colocated";
  if (c.serve.mode == "disaggregated") {
    if (router_colocated) {
      return absl::InvalidArgumentError(
          "serve.mode disaggregated contradicts router.mode colocated; set one of them");
    }
    layout.why = "serve.mode=disaggregated";
    return layout;
  }
  if (c.serve.mode == "colocated") {
    layout.colocated = true;
    layout.why = "serve.mode=colocated";
    return layout;
  }
  // auto. Measured on 2 CPU cores (docs/benchmarks.md, "tandem serve on one machine"): with one
  // device for both phases, colocated serves more tokens/s at every load and a lower TTFT than
  // disaggregated on a shared pool; a phase on a device of its own is what disaggregation buys.
  if (router_colocated) {
    layout.colocated = true;
    layout.why = "auto: router.mode=colocated";
  } else if (c.kv_cache_optimization.enabled) {
    layout.why = "auto: kv_cache_optimization prunes prefill, which only prefill workers run";
  } else if (layout.prefill_device == layout.decode_device) {
    layout.colocated = true;
    layout.why =
        absl::StrCat("auto: prefill and decode would share ", layout.decode_device.ToString(),
                     "; one engine batching both serves it best");
  } else {
    layout.why =
        absl::StrCat("auto: prefill and decode each have a device (",
                     layout.prefill_device.ToString(), ", ", layout.decode_device.ToString(), ")");
  }
  return layout;
}

}  // namespace tandem::cli
