#pragma once

#include <memory>
#include <string>

#include "common/model/model.h"
#include "common/util/thread_pool.h"
#include "tools/make_random_model/model_spec.h"

namespace tandem::testing {

// A fresh directory under the test's temp dir (TEST_TMPDIR, else TMPDIR, else /tmp), unique per
// call; removed with what it holds when the test binary exits.
std::string MakeTempDir(const std::string& prefix);

// Writes a random model for `spec` into a temp dir and returns its path (aborts the test on
// failure via ADD_FAILURE + empty string).
std::string WriteTempModel(const make_random_model::ModelSpec& spec, int shards = 1);

// A tiny f32 model spec of `arch` used by engine and model tests.
make_random_model::ModelSpec TinySpec(
    make_random_model::Arch arch = make_random_model::Arch::kLlama);

}  // namespace tandem::testing
