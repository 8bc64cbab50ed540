// The standard `process_*` metrics of a Tandem process, read from /proc at every scrape and
// labelled with the process's `role` ("router", "prefill", "decode", "cache_store", or "serve"
// for the all-in-one process), so a dashboard can chart CPU and memory per role.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>
#include <vector>

namespace tandem::metrics {

class ProcessCollector : public prometheus::Collectable {
 public:
  explicit ProcessCollector(std::string role) : role_(std::move(role)) {}

  // process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
  // process_open_fds, process_max_fds and process_start_time_seconds; an empty list where
  // /proc cannot be read.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::string role_;
};

}  // namespace tandem::metrics
