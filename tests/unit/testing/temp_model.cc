#include "tests/unit/testing/temp_model.h"

#include <stdlib.h>

#include <atomic>

#include "gtest/gtest.h"
#include "tools/make_random_model/model_writer.h"

namespace tandem::testing {

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir() + "/" + prefix + "XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    return "";
  }
  return tmpl;
}

std::string WriteTempModel(const make_random_model::ModelSpec& spec, int shards) {
  std::string dir = MakeTempDir("model");
  absl::Status s = make_random_model::WriteModelDir(spec, dir, shards);
  if (!s.ok()) {
    ADD_FAILURE() << s;
    return "";
  }
  return dir;
}

make_random_model::ModelSpec TinySpec(make_random_model::Arch arch) {
  make_random_model::ModelSpec spec;
  spec.arch = arch;
  spec.layers = 2;
  spec.hidden = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.ffn = 96;
  spec.vocab = 128;
  spec.max_pos = 512;
  spec.seed = 7;
  if (arch == make_random_model::Arch::kQwen3) spec.head_dim = 32;
  return spec;
}

}  // namespace tandem::testing
