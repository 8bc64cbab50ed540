// Builds CliArgs from a list of words, as `tandem bench ...` would receive them.
#pragma once

#include <string>
#include <vector>

#include "bench/serving/bench_command.h"
#include "common/util/cli_args.h"

namespace tandem::bench::testing {

inline absl::StatusOr<CliArgs> BenchArgs(std::vector<std::string> words) {
  words.insert(words.begin(), {"tandem", "bench"});
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return CliArgs::Parse(static_cast<int>(argv.size()), argv.data(), BenchSwitches());
}

}  // namespace tandem::bench::testing
