// libFuzzer target: `tandem bench --dataset` and `tandem plan --trace` files (JSON Lines of
// prompts or trace lines), and what both build from an accepted one: the synthesized prompts
// and the replayed send times.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "bench/serving/dataset.h"
#include "common/planner/simulator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto requests = tandem::bench::ParseJsonlDataset(text, "dataset.jsonl");
  if (!requests.ok()) return 0;
  (void)tandem::bench::PromptLengths(*requests);
  std::vector<tandem::bench::BenchRequest> small;  // prompts of up to 4096 tokens: bounded memory
  std::vector<double> times;
  for (const tandem::bench::BenchRequest& r : *requests) {
    if (r.input_length <= 4096) small.push_back(r);
    if (r.timestamp_s >= 0) times.push_back(r.timestamp_s);
  }
  tandem::bench::SynthesizePrompts(small, 1000, 1);
  for (const tandem::bench::BenchRequest& r : small) {
    if (r.input_length > 0 && static_cast<int32_t>(r.prompt_token_ids.size()) != r.input_length) {
      __builtin_trap();
    }
  }
  const std::vector<double> tiled =
      tandem::planner::TileTimestamps(times, static_cast<int64_t>(times.size()) * 2 + 1);
  for (double rate : {0.5, 1e6}) {
    const std::vector<double> replayed = tandem::planner::ReplayArrivals(tiled, rate);
    for (size_t i = 1; i < replayed.size(); ++i) {
      if (replayed[i] < replayed[i - 1]) __builtin_trap();  // send times never go back
    }
  }
  return 0;
}
