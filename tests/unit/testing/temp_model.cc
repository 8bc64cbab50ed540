#include "tests/unit/testing/temp_model.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tools/make_random_model/model_writer.h"

namespace tandem::testing {
namespace {

// The directories MakeTempDir made, removed when the test binary exits, by the process that
// made them (not a death test's child). A test that crashes leaves its own: scripts/test.sh runs
// the suites under a TMPDIR of the run's, which it removes.
class TempDirs {
 public:
  void Add(std::string dir) {
    absl::MutexLock lock(&mu_);
    dirs_.push_back(std::move(dir));
  }
  ~TempDirs() {
    if (getpid() != owner_) return;
    absl::MutexLock lock(&mu_);
    for (const std::string& dir : dirs_) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  const pid_t owner_ = getpid();
  absl::Mutex mu_;
  std::vector<std::string> dirs_ ABSL_GUARDED_BY(mu_);
};

TempDirs& Made() {
  static TempDirs dirs;  // destroyed at exit
  return dirs;
}

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = ::testing::TempDir() + "/" + prefix + "XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    return "";
  }
  Made().Add(tmpl);
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
