// Configuration of the router (RouterService and every call it serves).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/security/api_keys.h"
#include "router/balancer.h"
#include "router/request_validation.h"
#include "router/worker_pool.h"
#include "tandem/v1/kv.pb.h"

namespace tandem {
class TimeSource;
}

namespace tandem::router {

struct RouterOptions {
  std::string model_name;
  std::string architecture;
  std::string kv_dtype;
  std::string model_id;  // enters every block hash (must match the workers')
  ModelLimits limits;
  std::vector<int32_t> eos_token_ids;
  int block_size = 16;
  int64_t kv_bytes_per_block = 0;
  // The KV cache every worker must hold (dtype "mixed" for a mixed-precision cache): the registry
  // refuses a worker that reports another. An empty dtype checks nothing.
  tandem::v1::KvLayout kv_layout;
  int max_queued_requests = 1024;
  int64_t max_queued_tokens = 1 << 20;
  std::chrono::duration<double> default_deadline = std::chrono::seconds(600);
  // A Generate stream whose client has not taken a message for this long (it stopped reading)
  // is cancelled (StreamWatchdog); 0: never.
  std::chrono::milliseconds grpc_write_timeout = std::chrono::seconds(30);
  // Colocated: decode workers run whole requests (prefill included); prefill is skipped.
  bool colocated = false;
  int max_attempts = 4;  // prefill and decode attempts per request (retries, migrations)
  BalancerOptions balancer;
  // The window of the workload statistics the planner advisor plans for (planner.window_seconds).
  std::chrono::duration<double> workload_window = std::chrono::minutes(5);
  int64_t max_prefill_ahead_bytes = int64_t{256} << 20;
  WorkerPoolOptions pool;
  // The balancer's and the pacer's clock; null is the steady clock. Tests drive their own.
  const TimeSource* clock = nullptr;
  // The public API's keys (security.api_keys_file); null: no key needed. Must outlive the
  // router.
  security::ApiKeys* api_keys = nullptr;
  // Salt each request's cache blocks with its API key's name, so tenants never share (and cannot
  // time) each other's cached prompts; requests may add a cache_salt of their own either way.
  bool cache_salt_per_key = false;
};

}  // namespace tandem::router
