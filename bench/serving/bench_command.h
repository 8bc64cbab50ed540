// `tandem bench`: an open-loop serving benchmark against tandem.v1.Inference/Generate, in the
// manner of vLLM's benchmark_serving.py and SGLang's bench_serving. Prints a report table on
// stdout, optionally JSON to a file, and a progress bar on stderr.
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "common/util/cli_args.h"

namespace tandem::bench {

inline constexpr char kBenchUsage[] =
    "usage: tandem bench --addr HOST:PORT [--api grpc|http] [flags]\n"
    "  Open-loop load: requests arrive as a Poisson process and are sent on time whether or\n"
    "  not earlier ones finished. Every request sets max_tokens and ignore_eos.\n"
    "  --num-requests N         requests to send (default 1000; with --dataset, its lines)\n"
    "  --request-rate R         mean arrivals per second, or inf = all at once (default inf);\n"
    "                           a trace with timestamps is replayed, scaled to R if given\n"
    "  --max-concurrency C      at most C requests in flight; 0 = unlimited (default 0)\n"
    "  --seed S                 seed of the prompts and the arrival times (default 0)\n"
    "  --input-len L            random prompts: mean prompt tokens (default 1024)\n"
    "  --input-len-range F      lengths uniform in [L*(1-F), L*(1+F)], 0 <= F < 1 (default 0)\n"
    "  --output-len L           random prompts: mean max_tokens (default 128)\n"
    "  --output-len-range F     as --input-len-range, for --output-len (default 0)\n"
    "  --vocab-size V           random token ids below V (default: the server's model)\n"
    "  --dataset FILE           JSON Lines instead of random prompts (taken in order, wrapping\n"
    "                           around): {\"prompt\": \"...\", \"max_tokens\": N}, or a trace "
    "line\n"
    "                           {\"timestamp\": MS, \"input_length\": N, \"output_length\": M,\n"
    "                           \"hash_ids\": [...]} (Mooncake's; ids made for its blocks)\n"
    "  --timeout-seconds T      deadline of every request (default 600)\n"
    "  --slo-ttft-ms MS         goodput: time to first token at most MS\n"
    "  --slo-tpot-ms MS         goodput: time per output token at most MS\n"
    "  --json-out FILE          also write the report as JSON\n"
    "  --progress[=true|false]  progress bar on stderr (default: when stderr is a terminal)\n"
    "  --connections K          gRPC connections to spread the streams over (default 4);\n"
    "                           with --api http, the client's I/O threads (at most 4)\n"
    "  --api grpc|http          grpc: tandem.v1.Inference/Generate (default); http: streamed\n"
    "                           POST /v1/completions to an OpenAI-compatible server, one\n"
    "                           connection per request (random prompts need --vocab-size)\n"
    "  --api-key KEY            sent as `authorization: Bearer KEY` (both APIs)\n"
    "  --ca-file PEM            TLS (gRPC) or HTTPS (--api http), the server verified against\n"
    "                           this CA and the host name in --addr\n";

// Flags of `tandem bench` that take no value; pass them to CliArgs::Parse.
inline std::set<std::string> BenchSwitches() { return {"progress"}; }

// Runs the benchmark the flags describe. InvalidArgument naming the flag for bad flags; the
// server's status when it cannot be reached; an error when no request succeeded (the report
// is printed first). Failed requests otherwise show in the report, not in the status.
absl::Status RunBenchCommand(const CliArgs& args);

}  // namespace tandem::bench
