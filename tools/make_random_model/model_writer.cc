#include "tools/make_random_model/model_writer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/make_random_model/random_fill.h"
#include "tools/make_random_model/safetensors_writer.h"

namespace tandem::make_random_model {
namespace {

namespace fs = std::filesystem;

absl::Status WriteJson(const fs::path& path, const nlohmann::json& json) {
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

bool IsWeightFile(const std::string& name) {
  return name == "model.safetensors" || name == "model.safetensors.index.json" ||
         (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"));
}

absl::Status PrepareDir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && IsWeightFile(e.path().filename().string())) {
      fs::remove(e.path(), ec);
    }
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot clean ", dir.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int>> AssignShards(const std::vector<TensorSpec>& tensors, int shards) {
  const int64_t n = static_cast<int64_t>(tensors.size());
  if (shards < 1 || shards > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards must be between 1 and the tensor count (", n, ")"));
  }
  int64_t total = 0;
  for (const TensorSpec& t : tensors) total += t.NumElements();
  // A tensor goes to the shard its middle byte falls in, but shards are contiguous, none is
  // skipped, and enough tensors are left for the shards after it.
  std::vector<int> shard_of(n);
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t size = tensors[i].NumElements();
    const double middle = (static_cast<double>(offset) + 0.5 * size) / static_cast<double>(total);
    int s = std::min(shards - 1, static_cast<int>(middle * shards));
    if (i == 0) {
      s = 0;
    } else {
      s = std::clamp(s, shard_of[i - 1], shard_of[i - 1] + 1);
    }
    s = std::max<int64_t>(s, shards - n + i);
    shard_of[i] = s;
    offset += size;
  }
  return shard_of;
}

absl::Status WriteModelDir(const ModelSpec& spec, const std::string& dir_name, int shards) {
  const fs::path dir(dir_name);
  absl::Status st = PrepareDir(dir);
  if (!st.ok()) return st;
  st = WriteJson(dir / "config.json", ConfigJson(spec));
  if (!st.ok()) return st;
  st = WriteJson(dir / "generation_config.json", GenerationConfigJson(spec));
  if (!st.ok()) return st;

  const std::vector<TensorSpec> tensors = TensorList(spec);
  absl::StatusOr<std::vector<int>> shard_of = AssignShards(tensors, shards);
  if (!shard_of.ok()) return shard_of.status();
  const double std = spec.InitStd();
  const TensorSource source = [&](const TensorSpec& t, int64_t first_block, int64_t n, float* out) {
    FillBlocks(t.init, std, TensorSeed(spec.seed, t.name), first_block, n, out);
  };

  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total_bytes = 0;
  for (int s = 0; s < shards; ++s) {
    const std::string file = shards == 1
                                 ? "model.safetensors"
                                 : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<const TensorSpec*> group;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if ((*shard_of)[i] == s) {
        group.push_back(&tensors[i]);
        weight_map[tensors[i].name] = file;
      }
    }
    absl::StatusOr<int64_t> bytes =
        WriteSafetensors((dir / file).string(), group, spec.dtype, source);
    if (!bytes.ok()) return bytes.status();
    total_bytes += *bytes;
  }
  if (shards > 1) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    st = WriteJson(dir / "model.safetensors.index.json", index);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace tandem::make_random_model
