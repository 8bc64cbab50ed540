#include "common/config/config.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/config_schema.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"

namespace tandem::config {
namespace {

using internal::Field;
using internal::Schema;

absl::Status KeyError(const std::string& source, const std::string& key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", what));
}

// True if some key lies below `section` ("kv_cache" for "kv_cache.block_size").
bool IsSection(std::string_view section) {
  for (const Field& f : Schema()) {
    if (f.key.size() > section.size() && f.key.starts_with(section) &&
        f.key[section.size()] == '.') {
      return true;
    }
  }
  return false;
}

// The keys directly below `section` (or the top-level sections), for "unknown key" messages.
std::string KnownKeys(std::string_view section) {
  std::vector<std::string> names;
  for (const Field& f : Schema()) {
    std::string_view rest = f.key;
    if (!section.empty()) {
      if (!rest.starts_with(section) || rest.size() <= section.size() ||
          rest[section.size()] != '.') {
        continue;
      }
      rest.remove_prefix(section.size() + 1);
    }
    std::string first(rest.substr(0, rest.find('.')));
    if (std::find(names.begin(), names.end(), first) == names.end()) names.push_back(first);
  }
  return absl::StrJoin(names, ", ");
}

absl::Status Walk(const YAML::Node& map, const std::string& section, const std::string& source,
                  TandemConfig& config) {
  for (const auto& entry : map) {
    if (!entry.first.IsScalar()) {
      return KeyError(source, section.empty() ? "(top level)" : section, "keys must be strings");
    }
    const std::string key =
        section.empty() ? entry.first.Scalar() : absl::StrCat(section, ".", entry.first.Scalar());
    const YAML::Node& value = entry.second;
    if (const Field* field = internal::FindField(key)) {
      absl::Status s = field->set(config, value);
      if (!s.ok()) return KeyError(source, key, s.message());
      continue;
    }
    if (!IsSection(key)) {
      return KeyError(source, key, absl::StrCat("unknown key; known here: ", KnownKeys(section)));
    }
    if (value.IsNull()) continue;  // an empty section keeps its defaults
    if (!value.IsMap()) return KeyError(source, key, "expected a mapping of keys");
    TANDEM_RETURN_IF_ERROR(Walk(value, key, source, config));
  }
  return absl::OkStatus();
}

// Checks that span several keys.
absl::Status Validate(const TandemConfig& c, const std::string& source) {
  if (c.scheduler.chunk_size > c.scheduler.max_num_batched_tokens) {
    return KeyError(
        source, "scheduler.chunk_size",
        absl::StrCat(c.scheduler.chunk_size, " exceeds scheduler.max_num_batched_tokens (",
                     c.scheduler.max_num_batched_tokens, ")"));
  }
  if (c.balancer.hit_rate_threshold + c.balancer.hysteresis > 1.0 &&
      c.balancer.hit_rate_threshold < 1.0) {
    return KeyError(source, "balancer.hysteresis",
                    "threshold + hysteresis above 1: the balancer could never disengage");
  }
  if (!c.planner.profile.empty() && c.planner.slo_ttft_ms <= 0 && c.planner.slo_tpot_ms <= 0) {
    return KeyError(source, "planner.profile",
                    "give planner.slo_ttft_ms and/or planner.slo_tpot_ms: without an SLO any "
                    "deployment meets it");
  }
  const TlsConfig& tls = c.security.tls;
  const int tls_files = !tls.ca_file.empty() + !tls.cert_file.empty() + !tls.key_file.empty();
  if (tls_files != 0 && tls_files != 3) {
    return KeyError(source, "security.tls",
                    "give ca_file, cert_file and key_file together (or none: plaintext)");
  }
  if (c.cache_store.transport == "ucx" && tls_files == 3 &&
      !c.security.allow_unencrypted_kv_fabric) {
    return KeyError(source, "cache_store.transport",
                    "ucx moves KV bytes unencrypted, and security.tls is set: use grpc or shm, "
                    "or set security.allow_unencrypted_kv_fabric: true for a dedicated fabric");
  }
  const auto& pop = c.kv_cache_optimization;
  if (pop.pruning_ratio > 0 && pop.pruning_start_layer > 0) {
    return KeyError(source, "kv_cache_optimization.pruning.ratio",
                    "give pruning.start_layer or pruning.ratio, not both");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TandemConfig> ParseConfig(std::string_view yaml, std::string_view source_name) {
  const std::string source(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  TandemConfig config;
  if (root.IsNull()) return config;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a mapping of sections at the top level"));
  }
  try {
    TANDEM_RETURN_IF_ERROR(Walk(root, "", source, config));
  } catch (const YAML::Exception& e) {  // e.g. an alias to a missing anchor
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
  TANDEM_RETURN_IF_ERROR(Validate(config, source));
  return config;
}

absl::StatusOr<TandemConfig> LoadConfigFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseConfig(text, path);
}

namespace {

// One key=value into `config`, checked on its own (the cross-key checks are the caller's).
absl::Status SetKey(TandemConfig& config, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--set ", std::string(assignment), ": expected key=value, e.g. kv_cache.block_size=32"));
  }
  const std::string key(assignment.substr(0, eq));
  const Field* field = internal::FindField(key);
  if (field == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--set: unknown key ", key));
  }
  YAML::Node value;
  try {
    value = YAML::Load(std::string(assignment.substr(eq + 1)));
  } catch (const YAML::Exception& e) {
    return KeyError("--set", key, e.msg);
  }
  absl::Status s = field->set(config, value);
  if (!s.ok()) return KeyError("--set", key, s.message());
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyOverride(TandemConfig& config, std::string_view assignment) {
  const std::string one(assignment);
  return ApplyOverrides(config, std::span<const std::string>(&one, 1));
}

absl::Status ApplyOverrides(TandemConfig& config, std::span<const std::string> assignments) {
  TandemConfig updated = config;
  for (const std::string& assignment : assignments) {
    TANDEM_RETURN_IF_ERROR(SetKey(updated, assignment));
  }
  TANDEM_RETURN_IF_ERROR(Validate(updated, "--set"));
  config = std::move(updated);
  return absl::OkStatus();
}

std::string ConfigReferenceMarkdown() {
  const TandemConfig defaults;
  std::string out;
  std::string section;
  for (const Field& f : Schema()) {
    const std::string top = f.key.substr(0, f.key.find('.'));
    if (top != section) {
      section = top;
      absl::StrAppend(&out, out.empty() ? "" : "\n", "### `", section, "`\n\n",
                      "| key | type | default | meaning |\n|---|---|---|---|\n");
    }
    absl::StrAppend(&out, "| `", f.key, "` | ", f.type, " | `", f.show(defaults), "` | ", f.doc,
                    " |\n");
  }
  return out;
}

std::string ToYaml(const TandemConfig& config) {
  std::string out;
  std::vector<std::string> open;  // path of the mappings printed so far
  for (const Field& f : Schema()) {
    std::vector<std::string> parts = absl::StrSplit(f.key, '.');
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) {
      ++common;
    }
    open.resize(common);
    for (size_t i = common; i + 1 < parts.size(); ++i) {
      absl::StrAppend(&out, std::string(2 * i, ' '), parts[i], ":\n");
      open.push_back(parts[i]);
    }
    absl::StrAppend(&out, std::string(2 * (parts.size() - 1), ' '), parts.back(), ": ",
                    f.show(config), "\n");
  }
  return out;
}

}  // namespace tandem::config
