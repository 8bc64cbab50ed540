// tandem: the command-line entry point. Subcommands:
//
//   tandem config [--config FILE] [--set key=value ...]   print the effective configuration
//   tandem config --reference                             Markdown reference of every key
//
// (serve, generate and bench join as the serving path lands.)
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "common/config/config.h"
#include "common/util/cli_args.h"
#include "common/util/status_macros.h"

namespace tandem {
namespace {

constexpr char kUsage[] =
    "usage: tandem config [--config FILE] [--set key=value ...] | tandem config --reference\n";

// The configuration a role starts with: the file (if any), then every --set in order.
absl::StatusOr<config::TandemConfig> EffectiveConfig(const CliArgs& args) {
  config::TandemConfig c;
  if (args.Has("config")) {
    TANDEM_ASSIGN_OR_RETURN(c, config::LoadConfigFile(*args.String("config")));
  }
  for (const std::string& assignment : args.All("set")) {
    TANDEM_RETURN_IF_ERROR(config::ApplyOverride(c, assignment));
  }
  return c;
}

absl::Status RunConfig(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"config", "set", "reference"}));
  if (args.Has("reference")) {
    std::fputs(config::ConfigReferenceMarkdown().c_str(), stdout);
    return absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(config::TandemConfig c, EffectiveConfig(args));
  std::fputs(config::ToYaml(c).c_str(), stdout);
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  TANDEM_ASSIGN_OR_RETURN(CliArgs args, CliArgs::Parse(argc, argv, {"reference", "help"}));
  const auto& words = args.positional();
  if (args.Has("help") || words.empty()) {
    std::fputs(kUsage, stdout);
    return words.empty() && !args.Has("help") ? absl::InvalidArgumentError("missing subcommand")
                                              : absl::OkStatus();
  }
  if (words[0] == "config" && words.size() == 1) return RunConfig(args);
  return absl::InvalidArgumentError("unknown subcommand \"" + words[0] + "\"\n" + kUsage);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::Status s = tandem::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "tandem: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
