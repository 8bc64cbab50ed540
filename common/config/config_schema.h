// The schema behind config.h: one Field per dotted key, in document order. Internal to
// common/config (config.cc parses and prints with it; tests enumerate it).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/config/config.h"

namespace YAML {
class Node;
}

namespace tandem::config::internal {

struct Field {
  std::string key;   // dotted path, e.g. "kv_cache.block_size"
  std::string type;  // as documented: "integer in [1, 1024]", "one of: mmap, hugepages", ...
  std::string doc;
  // Parses `node` into the field of `config`; the error message does not repeat the key.
  std::function<absl::Status(TandemConfig& config, const YAML::Node& node)> set;
  // The field's value in `config` as a YAML flow value.
  std::function<std::string(const TandemConfig& config)> show;
};

const std::vector<Field>& Schema();
const Field* FindField(std::string_view key);

}  // namespace tandem::config::internal
