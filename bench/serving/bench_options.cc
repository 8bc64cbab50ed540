#include "bench/serving/bench_options.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

const std::set<std::string>& KnownFlags() {
  static const std::set<std::string> known = {
      "addr",      "num-requests",    "request-rate", "max-concurrency",  "seed",
      "input-len", "input-len-range", "output-len",   "output-len-range", "vocab-size",
      "dataset",   "timeout-seconds", "slo-ttft-ms",  "slo-tpot-ms",      "json-out",
      "progress",  "connections",     "api",          "api-key",          "ca-file"};
  return known;
}

absl::Status OutOfRange(const std::string& flag, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", what));
}

absl::StatusOr<int64_t> IntIn(const CliArgs& args, const std::string& flag, int64_t fallback,
                              int64_t min, int64_t max) {
  TANDEM_ASSIGN_OR_RETURN(int64_t v, args.IntOr(flag, fallback));
  if (v < min || v > max) {
    return OutOfRange(flag, absl::StrCat("must be in [", min, ", ", max, "], got ", v));
  }
  return v;
}

// A number > 0 (or >= 0 when `allow_zero`).
absl::StatusOr<double> Positive(const CliArgs& args, const std::string& flag, double fallback,
                                bool allow_zero = false) {
  TANDEM_ASSIGN_OR_RETURN(double v, args.DoubleOr(flag, fallback));
  if (v < 0 || (!allow_zero && v == 0)) {
    return OutOfRange(flag, absl::StrCat(allow_zero ? "must be >= 0" : "must be > 0", ", got ",
                                         args.StringOr(flag, "")));
  }
  return v;
}

absl::StatusOr<double> Ratio(const CliArgs& args, const std::string& flag) {
  TANDEM_ASSIGN_OR_RETURN(double v, Positive(args, flag, 0.0, /*allow_zero=*/true));
  if (v >= 1) return OutOfRange(flag, absl::StrCat("must be in [0, 1), got ", v));
  return v;
}

absl::StatusOr<double> RequestRate(const CliArgs& args) {
  std::string text = absl::AsciiStrToLower(args.StringOr("request-rate", "inf"));
  if (text == "inf" || text == "infinity") return std::numeric_limits<double>::infinity();
  double v;
  if (!absl::SimpleAtod(text, &v) || !std::isfinite(v) || v <= 0) {
    return OutOfRange("request-rate", absl::StrCat("must be a number > 0 or \"inf\", got \"",
                                                   args.StringOr("request-rate", ""), "\""));
  }
  return v;
}

absl::Status CheckAddr(const std::string& addr) {
  size_t colon = addr.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(addr.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return OutOfRange("addr", absl::StrCat("must be HOST:PORT, got \"", addr, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<ProgressMode> Progress(const CliArgs& args) {
  if (!args.Has("progress")) return ProgressMode::kAuto;
  std::string v = absl::AsciiStrToLower(args.StringOr("progress", ""));
  if (v == "true" || v == "1") return ProgressMode::kOn;
  if (v == "false" || v == "0") return ProgressMode::kOff;
  return OutOfRange("progress", absl::StrCat("takes no value or true/false, got \"", v, "\""));
}

absl::Status ParsePrompts(const CliArgs& args, BenchOptions& o) {
  o.dataset = args.StringOr("dataset", "");
  if (args.Has("dataset")) {
    if (o.dataset.empty()) return OutOfRange("dataset", "must name a file");
    for (const char* flag : {"input-len", "input-len-range", "output-len", "output-len-range"}) {
      if (args.Has(flag)) {
        return OutOfRange(flag,
                          "applies to random prompts and cannot be used with --dataset "
                          "(each line sets its own lengths)");
      }
    }
  }
  if (args.Has("vocab-size")) {  // random prompts, and a trace's length-only lines
    TANDEM_ASSIGN_OR_RETURN(o.vocab_size,
                            IntIn(args, "vocab-size", 0, 1, std::numeric_limits<int32_t>::max()));
  }
  if (args.Has("dataset")) return absl::OkStatus();
  constexpr int64_t kMaxLen = 1 << 24;
  TANDEM_ASSIGN_OR_RETURN(o.input_len, IntIn(args, "input-len", o.input_len, 1, kMaxLen));
  TANDEM_ASSIGN_OR_RETURN(o.input_len_range, Ratio(args, "input-len-range"));
  TANDEM_ASSIGN_OR_RETURN(o.output_len, IntIn(args, "output-len", o.output_len, 1, kMaxLen));
  TANDEM_ASSIGN_OR_RETURN(o.output_len_range, Ratio(args, "output-len-range"));
  return absl::OkStatus();
}

absl::Status ParseSlo(const CliArgs& args, Slo& slo) {
  if (args.Has("slo-ttft-ms")) {
    TANDEM_ASSIGN_OR_RETURN(slo.ttft_ms, Positive(args, "slo-ttft-ms", 0));
  }
  if (args.Has("slo-tpot-ms")) {
    TANDEM_ASSIGN_OR_RETURN(slo.tpot_ms, Positive(args, "slo-tpot-ms", 0));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchOptions> ParseBenchOptions(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown(KnownFlags()));
  BenchOptions o;
  TANDEM_ASSIGN_OR_RETURN(o.addr, args.String("addr"));
  TANDEM_RETURN_IF_ERROR(CheckAddr(o.addr));
  o.num_requests_set = args.Has("num-requests");
  TANDEM_ASSIGN_OR_RETURN(o.num_requests,
                          IntIn(args, "num-requests", o.num_requests, 1, 100'000'000));
  TANDEM_ASSIGN_OR_RETURN(o.request_rate, RequestRate(args));
  TANDEM_ASSIGN_OR_RETURN(o.max_concurrency, IntIn(args, "max-concurrency", 0, 0, 1'000'000));
  TANDEM_ASSIGN_OR_RETURN(int64_t seed,
                          IntIn(args, "seed", 0, 0, std::numeric_limits<int64_t>::max()));
  o.seed = static_cast<uint64_t>(seed);
  TANDEM_RETURN_IF_ERROR(ParsePrompts(args, o));
  TANDEM_ASSIGN_OR_RETURN(o.timeout_s, Positive(args, "timeout-seconds", o.timeout_s));
  TANDEM_RETURN_IF_ERROR(ParseSlo(args, o.slo));
  if (args.Has("json-out")) {
    o.json_out = args.StringOr("json-out", "");
    if (o.json_out.empty()) return OutOfRange("json-out", "must name a file");
  }
  TANDEM_ASSIGN_OR_RETURN(o.progress, Progress(args));
  TANDEM_ASSIGN_OR_RETURN(int64_t connections, IntIn(args, "connections", o.connections, 1, 256));
  o.connections = static_cast<int>(connections);
  o.api = args.StringOr("api", o.api);
  o.api_key = args.StringOr("api-key", "");
  o.ca_file = args.StringOr("ca-file", "");
  if (o.api != "grpc" && o.api != "http") {
    return OutOfRange("api", absl::StrCat("must be grpc or http, got \"", o.api, "\""));
  }
  return o;
}

}  // namespace tandem::bench
