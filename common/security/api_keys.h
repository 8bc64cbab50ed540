// API keys for the public API (security.api_keys_file), and the quota each key's requests share.
//
// The file holds one key per line, never the key itself: the SHA-256 of the key in hex, the
// key's name (what logs and metrics show), and optional limits that override the defaults:
//
//   # sha256 of the key                                              name   limits
//   9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 alice  max_concurrent=8
//   60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752 batch tokens_per_minute=200000
//
// (`printf %s "$KEY" | sha256sum` prints the digest; `tandem api-key NAME` makes a key and its
// line.) Clients send `authorization: Bearer KEY` (gRPC metadata or HTTP header). The file is
// read again when it changes (looked at once a second at most), so a key removed from it is
// refused from then on; a file that no longer parses keeps the keys it last held, and says why
// in the log.
//
// Threads: every method may run on any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"

namespace tandem::security {

struct KeyLimits {
  int64_t max_concurrent = 0;     // requests in flight at once; 0: no limit
  int64_t tokens_per_minute = 0;  // prompt + generated tokens over the last 60 s; 0: no limit
};

struct ApiKeyEntry {
  std::string name;
  std::array<uint8_t, 32> digest{};
  KeyLimits limits;
};

// The file's keys; InvalidArgument naming the line for anything else. Names are unique.
absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(std::string_view text,
                                                      const KeyLimits& defaults);

// SHA-256 of `key` in hex, as the file holds it.
std::string KeyDigestHex(std::string_view key);
// A new random key: "tdm-" and 64 hex digits (256 bits from the system's CSPRNG).
absl::StatusOr<std::string> NewApiKey();

// A RESOURCE_EXHAUSTED error's hint: retry after this many seconds (HTTP Retry-After).
absl::Status WithRetryAfter(absl::Status status, int seconds);
std::optional<int> RetryAfterSeconds(const absl::Status& status);

class KeyQuota;

// One admitted request's hold on its key's quota: its concurrency slot, returned when the lease
// is destroyed (share it among the parts of one request), and the tokens it used.
class KeyLease {
 public:
  explicit KeyLease(std::shared_ptr<KeyQuota> quota);
  ~KeyLease();
  KeyLease(const KeyLease&) = delete;
  KeyLease& operator=(const KeyLease&) = delete;

  const std::string& name() const;
  // Prompt and generated tokens of a finished request (or one part of it).
  void AddTokens(int64_t tokens);

 private:
  std::shared_ptr<KeyQuota> quota_;
};

class ApiKeys {
 public:
  using Clock = std::chrono::steady_clock;
  // `metrics` may be null; it must outlive the keys.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(const std::string& path,
                                                       const KeyLimits& defaults,
                                                       metrics::Metrics* metrics);
  ~ApiKeys();

  // The name of the key `authorization` ("Bearer KEY") carries; UNAUTHENTICATED when it is
  // missing, malformed or no key of the file, counted as tandem_auth_denied_total{method,
  // reason="api_key"} (`method`: the RPC or HTTP path asked for). The digests are compared in
  // constant time.
  absl::StatusOr<std::string> Authenticate(std::string_view authorization,
                                           const std::string& method);
  // Authenticate, then the key's limits: RESOURCE_EXHAUSTED (with RetryAfterSeconds) when it
  // has max_concurrent requests in flight or used its tokens_per_minute.
  absl::StatusOr<std::shared_ptr<KeyLease>> Admit(std::string_view authorization,
                                                  const std::string& method);

  int size() const;  // keys held now

 private:
  ApiKeys(std::string path, KeyLimits defaults, metrics::Metrics* metrics);
  // Reads the file again if it changed and a second has passed since the last look.
  void MaybeReload();
  absl::StatusOr<std::string> Match(std::string_view authorization);
  absl::Status Reload(bool first);
  std::shared_ptr<KeyQuota> QuotaOf(const ApiKeyEntry& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const KeyLimits defaults_;
  metrics::Metrics* const metrics_;
  mutable absl::Mutex mu_;
  std::vector<ApiKeyEntry> keys_ ABSL_GUARDED_BY(mu_);
  // By key name, so a key's usage survives reloads (and a renamed digest starts afresh).
  std::map<std::string, std::shared_ptr<KeyQuota>> quotas_ ABSL_GUARDED_BY(mu_);
  Clock::time_point next_look_ ABSL_GUARDED_BY(mu_);
  std::pair<int64_t, int64_t> stamp_ ABSL_GUARDED_BY(mu_) = {-1, -1};  // mtime, size
  bool reloading_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::security
