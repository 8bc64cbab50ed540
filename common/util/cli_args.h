#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// Command-line flags of the form `--name value`, `--name=value` and bare `--switch`, plus
// positional words. Switches must be declared so `--switch positional` parses unambiguously.
class CliArgs {
 public:
  static absl::StatusOr<CliArgs> Parse(int argc, char** argv,
                                       const std::set<std::string>& switches);

  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(const std::string& name) const { return values_.contains(name); }
  // Every value of a flag given several times, in order (the other accessors see the last).
  std::vector<std::string> All(const std::string& name) const;
  absl::StatusOr<std::string> String(const std::string& name) const;
  std::string StringOr(const std::string& name, const std::string& fallback) const;
  absl::StatusOr<int64_t> IntOr(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> DoubleOr(const std::string& name, double fallback) const;
  // Byte counts accept K/M/G/T (powers of 1000) and Ki/Mi/Gi/Ti (powers of 1024), optional "B".
  absl::StatusOr<int64_t> BytesOr(const std::string& name, int64_t fallback) const;
  // A comma-separated list of integers.
  absl::StatusOr<std::vector<int32_t>> IntList(const std::string& name) const;
  // InvalidArgument naming the first flag not in `known`.
  absl::Status CheckKnown(const std::set<std::string>& known) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;
  std::vector<std::string> positional_;
};

absl::StatusOr<int64_t> ParseByteSize(const std::string& text);

}  // namespace tandem
