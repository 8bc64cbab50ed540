#include "common/security/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util/file_util.h"
#include "common/util/log.h"

namespace tandem::security {
namespace {

constexpr char kRetryPayload[] = "tandem.dev/retry-after";
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxFileBytes = 16 << 20;
constexpr int kMaxKeys = 100000;
constexpr int64_t kMaxLimit = int64_t{1} << 40;

std::array<uint8_t, 32> Sha256(absl::string_view data) {
  std::array<uint8_t, 32> out{};
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data());
  return out;
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '@';
  });
}

absl::Status LineError(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", what));
}

int64_t Second(ApiKeys::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

std::pair<int64_t, int64_t> Stamp(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {-1, -1};
  return {int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec, st.st_size};
}

}  // namespace

// One key name's limits and usage, shared by its leases.
class KeyQuota {
 public:
  KeyQuota(std::string name, KeyLimits limits, metrics::Metrics* metrics)
      : name_(std::move(name)), limits_(limits) {
    if (metrics != nullptr) {
      admitted_ = metrics->ApiKeyRequests(name_, "ok");
      over_concurrency_ = metrics->ApiKeyRequests(name_, "max_concurrent");
      over_tokens_ = metrics->ApiKeyRequests(name_, "tokens_per_minute");
      tokens_ = metrics->ApiKeyTokens(name_);
    }
    second_.fill(-1);
  }

  const std::string& name() const { return name_; }
  void SetLimits(const KeyLimits& limits) {
    absl::MutexLock lock(&mu_);
    limits_ = limits;
  }

  absl::Status Acquire(ApiKeys::Clock::time_point now) {
    prometheus::Counter* counter = nullptr;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      const int64_t sec = Second(now);
      if (limits_.max_concurrent > 0 && in_flight_ >= limits_.max_concurrent) {
        counter = over_concurrency_;
        status = WithRetryAfter(
            absl::ResourceExhaustedError(absl::StrCat(
                "API key ", name_, " has ", in_flight_, " requests in flight, its limit (",
                "max_concurrent=", limits_.max_concurrent, "); retry when one ends")),
            1);
      } else if (const int wait = TokenWait(sec); wait > 0) {
        counter = over_tokens_;
        status = WithRetryAfter(absl::ResourceExhaustedError(absl::StrCat(
                                    "API key ", name_, " used its tokens_per_minute (",
                                    limits_.tokens_per_minute, "); retry in ", wait, " s")),
                                wait);
      } else {
        ++in_flight_;
        counter = admitted_;
      }
    }
    if (counter != nullptr) counter->Increment();
    return status;
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }

  void AddTokens(int64_t tokens, ApiKeys::Clock::time_point now) {
    if (tokens <= 0) return;
    {
      absl::MutexLock lock(&mu_);
      const int64_t sec = Second(now);
      const size_t slot = static_cast<size_t>(sec % 60);
      if (second_[slot] != sec) {
        second_[slot] = sec;
        used_[slot] = 0;
      }
      used_[slot] += tokens;
    }
    if (tokens_ != nullptr) tokens_->Increment(static_cast<double>(tokens));
  }

 private:
  // Seconds until the tokens used over the last minute fall below the limit; 0: now.
  int TokenWait(int64_t now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (limits_.tokens_per_minute <= 0) return 0;
    int64_t used = 0;
    for (size_t i = 0; i < 60; ++i) {
      if (second_[i] > now - 60) used += used_[i];
    }
    // Oldest first: each second that leaves the window takes its tokens with it.
    for (int64_t s = now - 59; used >= limits_.tokens_per_minute && s <= now; ++s) {
      const size_t slot = static_cast<size_t>(s % 60);
      if (second_[slot] == s) used -= used_[slot];
      if (used < limits_.tokens_per_minute) return static_cast<int>(s + 60 - now);
    }
    return used >= limits_.tokens_per_minute ? 60 : 0;
  }

  const std::string name_;
  prometheus::Counter* admitted_ = nullptr;
  prometheus::Counter* over_concurrency_ = nullptr;
  prometheus::Counter* over_tokens_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  absl::Mutex mu_;
  KeyLimits limits_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Tokens used in each of the last 60 seconds: second_[s % 60] == s holds second s's.
  std::array<int64_t, 60> second_ ABSL_GUARDED_BY(mu_);
  std::array<int64_t, 60> used_ ABSL_GUARDED_BY(mu_){};
};

absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(std::string_view text_in,
                                                      const KeyLimits& defaults) {
  const absl::string_view text(text_in.data(), text_in.size());
  std::vector<ApiKeyEntry> keys;
  std::set<std::string> names;
  std::set<std::array<uint8_t, 32>> digests;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() < 2) {
      return LineError(number, "expected a SHA-256 digest (64 hex digits) and a name");
    }
    ApiKeyEntry key;
    key.limits = defaults;
    const absl::string_view hex = fields[0];
    if (hex.size() != 64 || !std::all_of(hex.begin(), hex.end(), [](char c) {
          return absl::ascii_isxdigit(static_cast<unsigned char>(c));
        })) {
      return LineError(number,
                       "the first field must be the key's SHA-256 in 64 hex digits "
                       "(the file never holds keys themselves)");
    }
    for (size_t i = 0; i < 32; ++i) {
      int byte = 0;
      absl::SimpleHexAtoi(hex.substr(2 * i, 2), &byte);
      key.digest[i] = static_cast<uint8_t>(byte);
    }
    if (!ValidName(fields[1])) {
      return LineError(number, "a key's name is 1-64 of A-Z a-z 0-9 . _ - @");
    }
    key.name = std::string(fields[1]);
    for (size_t f = 2; f < fields.size(); ++f) {
      const std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(fields[f], absl::MaxSplits('=', 1));
      int64_t v = -1;
      if (!absl::SimpleAtoi(kv.second, &v) || v < 0 || v > kMaxLimit) {
        return LineError(
            number, absl::StrCat("\"", std::string(fields[f]),
                                 "\": a limit is NAME=N, N an integer in [0, ", kMaxLimit, "]"));
      }
      if (kv.first == "max_concurrent") {
        key.limits.max_concurrent = v;
      } else if (kv.first == "tokens_per_minute") {
        key.limits.tokens_per_minute = v;
      } else {
        return LineError(number, absl::StrCat("unknown limit \"", std::string(kv.first),
                                              "\" (max_concurrent, tokens_per_minute)"));
      }
    }
    if (!names.insert(key.name).second) {
      return LineError(number, absl::StrCat("the name ", key.name, " is used twice"));
    }
    if (!digests.insert(key.digest).second) {
      return LineError(number, "this digest is already a key of the file");
    }
    if (static_cast<int>(keys.size()) >= kMaxKeys) {
      return LineError(number, absl::StrCat("more than ", kMaxKeys, " keys"));
    }
    keys.push_back(std::move(key));
  }
  return keys;
}

std::string KeyDigestHex(std::string_view key) {
  const std::array<uint8_t, 32> d = Sha256(absl::string_view(key.data(), key.size()));
  std::string hex;
  for (uint8_t b : d) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

absl::StatusOr<std::string> NewApiKey() {
  std::array<uint8_t, 32> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return absl::InternalError("the system's random number generator failed");
  }
  std::string key = "tdm-";
  for (uint8_t b : bytes) absl::StrAppend(&key, absl::Hex(b, absl::kZeroPad2));
  return key;
}

absl::Status WithRetryAfter(absl::Status status, int seconds) {
  status.SetPayload(kRetryPayload, absl::Cord(absl::StrCat(seconds)));
  return status;
}

std::optional<int> RetryAfterSeconds(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryPayload);
  int seconds = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &seconds)) {
    return std::nullopt;
  }
  return seconds;
}

KeyLease::KeyLease(std::shared_ptr<KeyQuota> quota) : quota_(std::move(quota)) {}
KeyLease::~KeyLease() { quota_->Release(); }
const std::string& KeyLease::name() const { return quota_->name(); }
void KeyLease::AddTokens(int64_t tokens) { quota_->AddTokens(tokens, ApiKeys::Clock::now()); }

ApiKeys::ApiKeys(std::string path, KeyLimits defaults, metrics::Metrics* metrics)
    : path_(std::move(path)), defaults_(defaults), metrics_(metrics) {}

ApiKeys::~ApiKeys() = default;

absl::StatusOr<std::unique_ptr<ApiKeys>> ApiKeys::Load(const std::string& path,
                                                       const KeyLimits& defaults,
                                                       metrics::Metrics* metrics) {
  std::unique_ptr<ApiKeys> keys(new ApiKeys(path, defaults, metrics));
  absl::Status s = keys->Reload(/*first=*/true);
  if (!s.ok()) return s;
  return keys;
}

absl::Status ApiKeys::Reload(bool first) {
  const std::pair<int64_t, int64_t> stamp = Stamp(path_);
  absl::StatusOr<std::string> text = ReadFileToString(path_, kMaxFileBytes);
  absl::StatusOr<std::vector<ApiKeyEntry>> parsed =
      text.ok() ? ParseApiKeys(*text, defaults_) : text.status();
  if (!parsed.ok()) {
    const absl::Status error = absl::InvalidArgumentError(
        absl::StrCat("security.api_keys_file ", path_, ": ", parsed.status().message()));
    absl::MutexLock lock(&mu_);
    reloading_ = false;
    if (first) return error;
    stamp_ = stamp;  // said once per change
    Log(LogLevel::kWarning, "security",
        absl::StrCat(error.message(), "; keeping the ", keys_.size(), " keys it held"));
    return error;
  }
  absl::MutexLock lock(&mu_);
  reloading_ = false;
  stamp_ = stamp;
  for (const ApiKeyEntry& k : *parsed) QuotaOf(k)->SetLimits(k.limits);
  keys_ = *std::move(parsed);
  if (!first) {
    Log(LogLevel::kInfo, "security",
        absl::StrCat("security.api_keys_file ", path_, " reloaded: ", keys_.size(), " keys"));
  }
  return absl::OkStatus();
}

std::shared_ptr<KeyQuota> ApiKeys::QuotaOf(const ApiKeyEntry& key) {
  std::shared_ptr<KeyQuota>& q = quotas_[key.name];
  if (q == nullptr) q = std::make_shared<KeyQuota>(key.name, key.limits, metrics_);
  return q;
}

void ApiKeys::MaybeReload() {
  const Clock::time_point now = Clock::now();
  {
    absl::MutexLock lock(&mu_);
    if (reloading_ || now < next_look_) return;
    next_look_ = now + std::chrono::seconds(1);
    if (Stamp(path_) == stamp_) return;
    reloading_ = true;  // this thread reads it, outside the lock
  }
  Reload(/*first=*/false).IgnoreError();
}

absl::StatusOr<std::string> ApiKeys::Authenticate(std::string_view authorization,
                                                  const std::string& method) {
  absl::StatusOr<std::string> name = Match(authorization);
  if (!name.ok() && metrics_ != nullptr) metrics_->AuthDenied(method, "api_key")->Increment();
  return name;
}

absl::StatusOr<std::string> ApiKeys::Match(std::string_view authorization) {
  MaybeReload();
  const absl::string_view value =
      absl::StripAsciiWhitespace(absl::string_view(authorization.data(), authorization.size()));
  if (value.empty()) {
    return absl::UnauthenticatedError(
        "missing API key: send the header `authorization: Bearer KEY`");
  }
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("the authorization header must be `Bearer KEY`");
  }
  const absl::string_view key = absl::StripAsciiWhitespace(value.substr(7));
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::UnauthenticatedError("invalid API key");
  }
  const std::array<uint8_t, 32> digest = Sha256(key);
  absl::MutexLock lock(&mu_);
  // Every digest is compared, whatever matches, in constant time each.
  const ApiKeyEntry* found = nullptr;
  for (const ApiKeyEntry& k : keys_) {
    const bool equal = CRYPTO_memcmp(k.digest.data(), digest.data(), digest.size()) == 0;
    found = equal ? &k : found;
  }
  if (found == nullptr) return absl::UnauthenticatedError("invalid API key");
  return found->name;
}

absl::StatusOr<std::shared_ptr<KeyLease>> ApiKeys::Admit(std::string_view authorization,
                                                         const std::string& method) {
  absl::StatusOr<std::string> name = Authenticate(authorization, method);
  if (!name.ok()) return name.status();
  std::shared_ptr<KeyQuota> quota;
  {
    absl::MutexLock lock(&mu_);
    auto it = quotas_.find(*name);
    if (it == quotas_.end()) return absl::UnauthenticatedError("invalid API key");
    quota = it->second;
  }
  absl::Status admitted = quota->Acquire(Clock::now());
  if (!admitted.ok()) return admitted;
  return std::make_shared<KeyLease>(std::move(quota));
}

int ApiKeys::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(keys_.size());
}

}  // namespace tandem::security
