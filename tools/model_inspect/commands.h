#pragma once

#include "absl/status/status.h"
#include "common/util/cli_args.h"

namespace tandem::tools {

absl::Status RunInfo(const CliArgs& args);
absl::Status RunKvCache(const CliArgs& args);
absl::Status RunForward(const CliArgs& args);
absl::Status RunGenerate(const CliArgs& args);

}  // namespace tandem::tools
