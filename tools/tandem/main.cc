// tandem: the command-line entry point.
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/serving/bench_command.h"
#include "common/config/config.h"
#include "common/security/api_keys.h"
#include "common/util/cli_args.h"
#include "common/util/process_tuning.h"
#include "common/util/status_macros.h"
#include "tools/tandem/commands.h"

namespace tandem::cli {
namespace {

constexpr char kUsage[] = R"(usage: tandem COMMAND [flags]

  serve [--config FILE] [--set key=value ...] [--model DIR] [--listen HOST:PORT]
        [--metrics-listen HOST:PORT] [--http-listen HOST:PORT]
      Router, prefill workers, decode workers and cache-store shards in one process (defaults:
      the bundled model, 1 prefill, 1 decode, 1 shard; router on 127.0.0.1:8000; with
      --http-listen, the OpenAI-compatible HTTP API too). Stops on SIGINT/SIGTERM after
      draining.
  router | prefill | decode | cache-store  [same flags as serve]
      One role, for deployments that run each role in its own process or pod.
  generate --addr HOST:PORT (--prompt TEXT | --tokens 1,2,3) [--max-tokens N] [--temperature T]
        [--top-p P] [--top-k K] [--seed S] [--stop STRING ...] [--ignore-eos] [--print-ids]
        [--timeout SECONDS] [--wait-ready] [--ca-file PEM] [--api-key KEY]
      Streams one completion from a router: text to stdout as it arrives (with --print-ids,
      the generated ids on a last line), a summary to stderr. --ca-file: TLS, the router's
      certificate verified against this CA and the host name in --addr. --api-key: sent as
      `authorization: Bearer KEY`.
  bench --addr HOST:PORT [flags]
      Open-loop load generator against a router: TTFT, inter-token and end-to-end latency
      percentiles, throughput and goodput (tandem bench --help for the flags).
  plan --profile P.json [--workload W.yaml] [--budget N] [--json] [flags]
      The placement planner: simulates colocated and disaggregated deployments of N replicas
      of the profiled engine (engine-bench --profile-out) on the workload (tandem bench's
      --input-len, --output-len, ranges, --slo-ttft-ms, --slo-tpot-ms, as flags or file keys)
      and prints each one's goodput: the highest request rate meeting the SLOs for 90% of
      requests (--attainment). With --rate R: the smallest deployment of each shape meeting
      the SLOs at R (--headroom, --max-replicas), as the router's planner advisor recommends
      it; with --live D --measured-ttft-ms T --measured-tpot-ms P, on the profile corrected
      to what deployment D measured, as the advisor corrects it. docs/planner.md has every
      flag.
  config [--config FILE] [--set key=value ...]   the effective configuration as YAML
  config --reference                             Markdown reference of every key
  health --addr HOST:PORT [--service NAME] [--config FILE] [--timeout SECONDS]
      A role's grpc.health.v1 status (prints it; exit 0 only when SERVING), over TLS with the
      configuration's security.tls when set: the Kubernetes probe of a TLS port.
  api-key NAME
      A new random API key for security.api_keys_file: prints the key (for the client; kept
      nowhere) and the file's line for it (its SHA-256 and NAME).
)";

// tandem api-key NAME
absl::Status RunApiKey(const std::string& name) {
  TANDEM_ASSIGN_OR_RETURN(std::string key, security::NewApiKey());
  const std::string line = absl::StrCat(security::KeyDigestHex(key), " ", name);
  TANDEM_RETURN_IF_ERROR(security::ParseApiKeys(line, {}).status());  // a valid name
  std::printf("key:  %s\nline: %s\n", key.c_str(), line.c_str());
  std::fflush(stdout);
  std::fprintf(stderr,
               "give the key to the client (Authorization: Bearer KEY); add the line to "
               "security.api_keys_file\n");
  return absl::OkStatus();
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
  std::set<std::string> switches = {"reference", "help",       "ignore-eos",
                                    "print-ids", "wait-ready", "json"};
  switches.merge(bench::BenchSwitches());
  TANDEM_ASSIGN_OR_RETURN(CliArgs args, CliArgs::Parse(argc, argv, switches));
  const auto& words = args.positional();
  if (!words.empty() && words[0] == "bench") {
    if (args.Has("help")) {
      std::fputs(bench::kBenchUsage, stdout);
      return absl::OkStatus();
    }
    return bench::RunBenchCommand(args);
  }
  if (args.Has("help") || words.empty()) {
    std::fputs(kUsage, stdout);
    return words.empty() && !args.Has("help") ? absl::InvalidArgumentError("missing command")
                                              : absl::OkStatus();
  }
  if (words[0] == "api-key") {
    if (words.size() != 2) return absl::InvalidArgumentError("usage: tandem api-key NAME");
    return RunApiKey(words[1]);
  }
  if (words.size() != 1) {
    return absl::InvalidArgumentError("unexpected argument \"" + words[1] + "\"");
  }
  const std::string& command = words[0];
  if (command == "config") return RunConfig(args);
  if (command == "serve") return RunServe(args);
  if (command == "generate") return RunGenerate(args);
  if (command == "health") return RunHealth(args);
  if (command == "plan") return RunPlan(args);
  if (command == "router" || command == "prefill" || command == "decode" ||
      command == "cache-store") {
    return RunRole(command, args);
  }
  return absl::InvalidArgumentError("unknown command \"" + command + "\" (see tandem --help)");
}

}  // namespace
}  // namespace tandem::cli

int main(int argc, char** argv) {
  tandem::TuneServingProcess();
  absl::Status s = tandem::cli::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "tandem: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
