// libFuzzer target: engine profiles (`tandem plan --profile`), and the step models and handoff
// times fitted to an accepted one.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/planner/profile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto profile = tandem::planner::EngineProfile::FromJson(text, "profile.json");
  if (!profile.ok()) return 0;
  for (bool prefill : {true, false}) {
    auto model = tandem::planner::StepModel::Fit(prefill ? profile->prefill : profile->decode,
                                                 prefill, "profile.json");
    if (model.ok()) {
      for (int64_t tokens : {int64_t{1}, int64_t{100}, int64_t{1} << 20}) {
        (void)model->Seconds(tokens, 1e6);
      }
    }
  }
  for (const char* transport : {"shm", "grpc"}) {
    (void)tandem::planner::TransferSeconds(*profile, transport, 1 << 20);
  }
  (void)profile->ToJson();
  return 0;
}
