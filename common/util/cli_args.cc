#include "common/util/cli_args.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {

absl::StatusOr<CliArgs> CliArgs::Parse(int argc, char** argv,
                                       const std::set<std::string>& switches) {
  CliArgs args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() < 3 || a.rfind("--", 0) != 0) {
      args.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::string value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else if (switches.contains(name)) {
      value = "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
    }
    args.values_[name] = value;
    args.all_[name].push_back(std::move(value));
  }
  return args;
}

std::vector<std::string> CliArgs::All(const std::string& name) const {
  auto it = all_.find(name);
  return it == all_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<std::string> CliArgs::String(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return it->second;
}

std::string CliArgs::StringOr(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> CliArgs::IntOr(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer, got \"", it->second, "\""));
  }
  return v;
}

absl::StatusOr<double> CliArgs::DoubleOr(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v) || !std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a number, got \"", it->second, "\""));
  }
  return v;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  absl::string_view s = text;
  absl::ConsumeSuffix(&s, "B");
  int64_t mult = 1;
  const std::pair<const char*, int64_t> suffixes[] = {
      {"Ki", 1LL << 10}, {"Mi", 1LL << 20}, {"Gi", 1LL << 30},   {"Ti", 1LL << 40},
      {"K", 1000LL},     {"M", 1000000LL},  {"G", 1000000000LL}, {"T", 1000000000000LL}};
  for (const auto& [suffix, m] : suffixes) {
    if (absl::ConsumeSuffix(&s, suffix)) {
      mult = m;
      break;
    }
  }
  double v;
  if (!absl::SimpleAtod(std::string(s), &v) || !(v >= 0) || v * mult > 9e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte size \"", text, "\" (examples: 1073741824, 80GiB, 16G)"));
  }
  return static_cast<int64_t>(v * mult);
}

absl::StatusOr<int64_t> CliArgs::BytesOr(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  auto v = ParseByteSize(it->second);
  if (!v.ok())
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", v.status().message()));
  return v;
}

absl::StatusOr<std::vector<int32_t>> CliArgs::IntList(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end())
    return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(it->second, ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": \"", std::string(part), "\" is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::Status CliArgs::CheckKnown(const std::set<std::string>& known) const {
  for (const auto& [name, value] : values_) {
    if (!known.contains(name))
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
  }
  return absl::OkStatus();
}

}  // namespace tandem
