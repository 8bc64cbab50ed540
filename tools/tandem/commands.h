// Subcommands of the `tandem` CLI (main.cc dispatches).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/config.h"
#include "common/util/cli_args.h"

namespace tandem::cli {

// The configuration a role starts with: --config FILE (if any), every --set in order, then the
// shorthand flags (--model, --listen, --metrics-listen).
absl::StatusOr<config::TandemConfig> EffectiveConfig(const CliArgs& args);

// tandem serve: every role in one process on loopback; blocks until SIGINT or SIGTERM.
absl::Status RunServe(const CliArgs& args);
// tandem router|prefill|decode|cache-store: one role; blocks until SIGINT or SIGTERM.
absl::Status RunRole(const std::string& role, const CliArgs& args);
// tandem generate: streams one completion from a router.
absl::Status RunGenerate(const CliArgs& args);
// tandem plan: the placement planner on an engine profile and a workload (docs/planner.md).
absl::Status RunPlan(const CliArgs& args);
// tandem health: a role's grpc.health.v1 status (TLS with the config's certificate).
absl::Status RunHealth(const CliArgs& args);

}  // namespace tandem::cli
