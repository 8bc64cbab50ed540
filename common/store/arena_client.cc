#include "common/store/arena_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/fabric/kv_protocol.h"
#include "common/rpc/status.h"
#include "common/store/block_checksum.h"
#include "common/store/shm_mapping.h"
#include "common/store/ucx_client.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::store {
namespace {

constexpr std::chrono::seconds kAttachRetry(5);
// An eager attach at startup waits at most this long (a worker's shutdown may wait for it).
constexpr std::chrono::seconds kConnectTimeout(5);
// Per reservation: bounds the arena space one lease holds while the client copies.
constexpr int64_t kMaxBatchBytes = int64_t{64} << 20;
constexpr size_t kMaxBatchBlocks = 4096;

// After these the arena is gone, replaced or not to be trusted: map it again next time.
bool ArenaGone(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

absl::Status BadReply(absl::string_view what) {
  return absl::InternalError(absl::StrCat("cache store arena: ", what));
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The lease an answer grants: its id and, on a keyed path, the 16-byte key that must come with
// it. InternalError for a keyed answer without one.
template <typename Response>
absl::StatusOr<LeaseGrant> GrantOf(const Response& response, bool keyed) {
  LeaseGrant grant{.id = response.lease_id()};
  if (!keyed || grant.id == 0) return grant;
  if (response.fabric_key().size() != sizeof grant.key) return BadReply("a lease without its key");
  std::memcpy(grant.key.data(), response.fabric_key().data(), sizeof grant.key);
  return grant;
}

}  // namespace

const char* ArenaTransportName(ArenaTransport transport) {
  return transport == ArenaTransport::kFabric ? "ucx" : "shm";
}

ArenaClient::ArenaClient(tandem::v1::CacheStore::StubInterface& stub, std::string model_id,
                         std::chrono::milliseconds timeout, ArenaTransport transport,
                         std::shared_ptr<UcxKvClient> fabric_client)
    : stub_(stub),
      model_id_(std::move(model_id)),
      timeout_(timeout),
      transport_(transport),
      fabric_client_(std::move(fabric_client)) {}

ArenaClient::~ArenaClient() {
  absl::MutexLock lock(&releases_mu_);
  releases_mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &releases_in_flight_));
}

void ArenaClient::SetDeadline(grpc::ClientContext& context, std::chrono::milliseconds timeout) {
  context.set_deadline(std::chrono::system_clock::now() + timeout);
}

bool ArenaClient::attached() const {
  absl::MutexLock lock(&mu_);
  return path_ != nullptr;
}

bool ArenaClient::Connect() {
  Path path = Attach(/*eager=*/true);
  if (path != nullptr) path->Connect();
  return path != nullptr;
}

ArenaClient::Path ArenaClient::Attach(bool eager) {
  {
    absl::MutexLock lock(&mu_);
    if (path_ != nullptr) return path_;
    if (Clock::now() < retry_after_) return nullptr;
  }
  const std::chrono::milliseconds timeout =
      eager ? std::min<std::chrono::milliseconds>(timeout_, kConnectTimeout) : timeout_;
  absl::StatusOr<Path> opened =
      transport_ == ArenaTransport::kFabric ? AttachFabric(timeout) : AttachSharedMemory(timeout);
  absl::MutexLock lock(&mu_);
  if (!opened.ok()) {
    if (eager) return nullptr;  // the shard may not be up yet: the first transfer tries again
    retry_after_ = Clock::now() + kAttachRetry;
    // Offered but not reachable (another machine or mount namespace, no UCX transport in
    // common): worth saying, once. A shard that does not offer the path is no news.
    if (!absl::IsFailedPrecondition(opened.status()) && !std::exchange(warned_, true)) {
      Log(LogLevel::kWarning, "cache-store-client",
          absl::StrCat(opened.status().ToString(), "; streaming instead"));
    }
    return nullptr;
  }
  if (path_ == nullptr) path_ = *std::move(opened);
  return path_;
}

absl::StatusOr<ArenaClient::Path> ArenaClient::AttachSharedMemory(
    std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  tandem::v1::AttachSharedMemoryResponse response;
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(
      stub_.AttachSharedMemory(&context, tandem::v1::AttachSharedMemoryRequest(), &response)));
  absl::StatusOr<std::unique_ptr<ShmMapping>> opened =
      ShmMapping::Open(response.path(), response.file_bytes(), response.instance_id());
  if (!opened.ok()) {  // offered but not mappable here: not the shard's refusal
    return absl::UnavailableError(opened.status().message());
  }
  // The pages exist already: mapping them now spares each block's first write its page faults.
  if (response.preallocated()) (*opened)->PopulateInBackground();
  lease_ = std::chrono::milliseconds(response.lease_ms());
  return Path(*std::move(opened));
}

absl::StatusOr<ArenaClient::Path> ArenaClient::AttachFabric(std::chrono::milliseconds timeout) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  tandem::v1::AttachFabricResponse response;
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(
      stub_.AttachFabric(&context, tandem::v1::AttachFabricRequest(), &response)));
  if (response.protocol() != fabric::kKvProtocolVersion) {
    // Another release's messages (a rolling upgrade): each would wait for its deadline.
    return absl::UnavailableError(absl::StrCat("the shard's KV fabric speaks protocol ",
                                               absl::Hex(response.protocol()), " and this worker ",
                                               absl::Hex(fabric::kKvProtocolVersion)));
  }
  std::shared_ptr<UcxKvClient> ucx = fabric_client_;
  if (ucx == nullptr) {
    TANDEM_ASSIGN_OR_RETURN(ucx, UcxKvClient::Shared());
  }
  lease_ = std::chrono::milliseconds(response.lease_ms());
  return Path(std::make_shared<UcxArenaPath>(std::move(ucx), response.worker_address(),
                                             response.instance_id(), response.arena_bytes(),
                                             timeout_));
}

void ArenaClient::Detach(const Path& path) {
  absl::MutexLock lock(&mu_);
  if (path_ == path) path_ = nullptr;  // unmapped when its last user is done
}

template <typename T>
std::optional<absl::StatusOr<T>> ArenaClient::Failed(const Path& path, const absl::Status& status) {
  if (ArenaGone(status)) Detach(path);
  if (absl::IsFailedPrecondition(status)) return std::nullopt;
  return absl::StatusOr<T>(status);
}

std::optional<absl::StatusOr<PutResult>> ArenaClient::Put(std::span<const BlockData> blocks) {
  Path path = Attach();
  if (path == nullptr) return std::nullopt;
  const int64_t max_bytes = std::min(kMaxBatchBytes, path->size() / 4);
  PutResult total;
  for (size_t begin = 0; begin < blocks.size();) {
    size_t end = begin + 1;
    int64_t bytes = static_cast<int64_t>(blocks[begin].bytes.size());
    while (end < blocks.size() && end - begin < kMaxBatchBlocks &&
           bytes + static_cast<int64_t>(blocks[end].bytes.size()) <= max_bytes) {
      bytes += static_cast<int64_t>(blocks[end++].bytes.size());
    }
    absl::StatusOr<PutResult> r = PutBatch(*path, blocks.subspan(begin, end - begin));
    if (!r.ok()) return Failed<PutResult>(path, r.status());
    total.stored += r->stored;
    total.skipped += r->skipped;
    total.bytes += r->bytes;
    begin = end;
  }
  return total;
}

absl::StatusOr<PutResult> ArenaClient::PutBatch(ArenaPath& path, std::span<const BlockData> blocks,
                                                std::span<const size_t> only) {
  std::vector<BlockSize> sizes;
  sizes.reserve(only.empty() ? blocks.size() : only.size());
  const auto add = [&](const BlockData& b) {
    sizes.push_back({b.hash, static_cast<int64_t>(b.bytes.size())});
  };
  if (only.empty()) {
    for (const BlockData& b : blocks) add(b);
  } else {
    for (size_t i : only) add(blocks[i]);
  }
  TANDEM_ASSIGN_OR_RETURN(const Reserved reserved, ReserveBatch(path, sizes));
  return CommitBatch(path, reserved, blocks, only);
}

absl::StatusOr<ArenaClient::Reserved> ArenaClient::ReserveBatch(ArenaPath& path,
                                                                std::span<const BlockSize> blocks,
                                                                bool ahead) {
  tandem::v1::ReserveShmRequest request;
  request.set_instance_id(path.instance_id());
  request.set_model_id(model_id_);
  request.set_ahead(ahead);
  request.set_fabric(path.keyed());
  for (const BlockSize& b : blocks) {
    tandem::v1::ShmBlockSize* size = request.add_blocks();
    size->set_block_hash(b.hash);
    size->set_block_bytes(b.bytes);
  }
  tandem::v1::ReserveShmResponse response;
  Reserved reserved;
  reserved.sent = Clock::now();
  {
    grpc::ClientContext context;
    SetDeadline(context);
    TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_.ReserveShm(&context, request, &response)));
  }
  // Check the whole answer before anyone writes a byte.
  absl::Status bad;
  reserved.regions.resize(blocks.size());
  uint32_t index = 0;  // among the reserved blocks, as the lease holds them
  if (response.reservations_size() != static_cast<int>(blocks.size())) {
    bad = BadReply("reservations for the wrong number of blocks");
  }
  for (size_t i = 0; bad.ok() && i < blocks.size(); ++i) {
    const tandem::v1::ShmReservation& r = response.reservations(static_cast<int>(i));
    if (r.block_hash() != blocks[i].hash) {
      bad = BadReply("reservations out of order");
    } else if (!r.reserved()) {
      ++reserved.skipped;
      if (r.pending()) reserved.pending.push_back(i);
    } else if (absl::Status region = path.CheckRegion(r.offset(), blocks[i].bytes); region.ok()) {
      reserved.regions[i] = {
          .index = index++, .offset = r.offset(), .length = blocks[i].bytes, .bytes = {}};
      reserved.bytes += blocks[i].bytes;
    } else {
      bad = BadReply(region.message());
    }
  }
  const bool any = reserved.skipped < static_cast<int>(blocks.size());
  if (bad.ok() && any && response.lease_id() == 0) bad = BadReply("reservations without a lease");
  absl::StatusOr<LeaseGrant> grant = GrantOf(response, path.keyed());
  if (bad.ok() && !grant.ok()) bad = grant.status();
  if (!bad.ok()) {
    if (response.lease_id() != 0) Release(path, response.lease_id());
    return bad;
  }
  if (any) reserved.lease = *grant;
  return reserved;
}

absl::StatusOr<PutResult> ArenaClient::CommitBatch(ArenaPath& path, const Reserved& reserved,
                                                   std::span<const BlockData> blocks,
                                                   std::span<const size_t> only) {
  PutResult result{.skipped = reserved.skipped, .bytes = reserved.bytes};
  if (reserved.lease.id == 0) return result;
  // The lease began after `sent`. A client this late (stalled, swapped out) must not write into
  // space the shard may already have handed to someone else.
  if (!LeaseHeld(reserved.sent)) {
    Release(path, reserved.lease.id);
    return absl::DeadlineExceededError("cache store arena: reservation too old to use");
  }
  std::vector<ArenaRegion> regions;
  for (size_t i = 0; i < reserved.regions.size(); ++i) {
    if (reserved.regions[i].length == 0) continue;
    regions.push_back(reserved.regions[i]);
    regions.back().bytes = Bytes(blocks[only.empty() ? i : only[i]].bytes);
  }
  absl::StatusOr<std::vector<uint64_t>> checksums = path.Write(reserved.lease, regions);
  if (!checksums.ok()) {
    Release(path, reserved.lease.id);
    return checksums.status();
  }
  tandem::v1::CommitShmRequest commit;
  commit.set_instance_id(path.instance_id());
  commit.set_lease_id(reserved.lease.id);
  for (uint64_t checksum : *checksums) commit.add_checksums(checksum);
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::CommitShmResponse committed;
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_.CommitShm(&context, commit, &committed)));
  result.stored = committed.stored();
  return result;
}

std::unique_ptr<ArenaClient::Reservation> ArenaClient::Reserve(std::span<const BlockSize> blocks) {
  Path path = Attach();
  if (path == nullptr || blocks.empty() || blocks.size() > kMaxBatchBlocks) return nullptr;
  int64_t bytes = 0;
  for (const BlockSize& b : blocks) bytes += b.bytes;
  if (bytes > std::min(kMaxBatchBytes, path->size() / 4)) return nullptr;
  absl::StatusOr<Reserved> reserved = ReserveBatch(*path, blocks, /*ahead=*/true);
  if (!reserved.ok()) {
    if (ArenaGone(reserved.status())) Detach(path);
    return nullptr;
  }
  return std::unique_ptr<Reservation>(
      new Reservation(*this, std::move(path), blocks, *std::move(reserved)));
}

std::optional<absl::StatusOr<PutResult>> ArenaClient::PutReserved(
    Reservation& reservation, std::span<const BlockData> blocks) {
  if (&reservation.client_ != this || reservation.used_) return std::nullopt;
  const Reserved& reserved = reservation.reserved_;
  bool fits = blocks.size() == reservation.blocks_.size();
  for (size_t i = 0; fits && i < blocks.size(); ++i) {
    fits = blocks[i].hash == reservation.blocks_[i].hash &&
           static_cast<int64_t>(blocks[i].bytes.size()) == reservation.blocks_[i].bytes;
  }
  if (!fits || (reserved.lease.id != 0 && !LeaseHeld(reserved.sent))) {
    // Ended before the caller puts the usual way: while the lease holds them, the shard takes
    // its blocks for ones being written and would skip them.
    if (!std::exchange(reservation.used_, true) && reserved.lease.id != 0) {
      ReleaseNow(*reservation.path_, reserved.lease.id);
    }
    return std::nullopt;
  }
  reservation.used_ = true;
  absl::StatusOr<PutResult> result = CommitBatch(*reservation.path_, reserved, blocks);
  if (!result.ok()) return Failed<PutResult>(reservation.path_, result.status());
  result->ahead = true;
  if (!reserved.pending.empty()) {
    // Another writer had these at Reserve and may still be computing them: reported stored,
    // they must be. The shard skips those committed since and gives the rest space of their own.
    absl::StatusOr<PutResult> late = PutBatch(*reservation.path_, blocks, reserved.pending);
    if (!late.ok()) return Failed<PutResult>(reservation.path_, late.status());
    result->skipped -= static_cast<int>(reserved.pending.size()) - late->skipped;
    result->stored += late->stored;
    result->bytes += late->bytes;
  }
  return result;
}

ArenaClient::Reservation::~Reservation() { Release(); }

void ArenaClient::Reservation::Release() {
  if (std::exchange(used_, true) || reserved_.lease.id == 0) return;
  client_.Release(*path_, reserved_.lease.id);
}

StoreTier FromProto(tandem::v1::StoreTier tier) {
  return tier == tandem::v1::STORE_TIER_DISK ? StoreTier::kDisk : StoreTier::kMemory;
}

std::optional<absl::StatusOr<std::vector<std::optional<std::string>>>> ArenaClient::Get(
    std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers) {
  using Blocks = std::vector<std::optional<std::string>>;
  Path path = Attach();
  if (path == nullptr) return std::nullopt;
  Blocks out(hashes.size());
  std::vector<StoreTier> found_in(hashes.size(), StoreTier::kNone);
  for (size_t begin = 0; begin < hashes.size(); begin += kMaxBatchBlocks) {
    const size_t n = std::min(kMaxBatchBlocks, hashes.size() - begin);
    absl::Status s = GetBatch(*path, hashes.subspan(begin, n),
                              std::span<std::optional<std::string>>(out).subspan(begin, n),
                              std::span<StoreTier>(found_in).subspan(begin, n));
    if (!s.ok()) return Failed<Blocks>(path, s);
  }
  if (tiers != nullptr) *tiers = std::move(found_in);
  return out;
}

absl::Status ArenaClient::GetBatch(ArenaPath& path, std::span<const uint64_t> hashes,
                                   std::span<std::optional<std::string>> out,
                                   std::span<StoreTier> tiers) {
  tandem::v1::AcquireShmRequest request;
  request.set_instance_id(path.instance_id());
  request.set_model_id(model_id_);
  for (uint64_t h : hashes) request.add_block_hashes(h);
  request.set_fabric(path.keyed());
  tandem::v1::AcquireShmResponse acquired;
  const Clock::time_point sent = Clock::now();
  {
    grpc::ClientContext context;
    SetDeadline(context);
    TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_.AcquireShm(&context, request, &acquired)));
  }
  absl::Status bad;
  std::vector<ArenaRegion> regions;  // of the blocks found
  std::vector<size_t> found;         // their positions in `hashes`
  if (acquired.blocks_size() != static_cast<int>(hashes.size())) {
    bad = BadReply("regions for the wrong number of blocks");
  }
  for (size_t i = 0; bad.ok() && i < hashes.size(); ++i) {
    const tandem::v1::ShmBlockRegion& b = acquired.blocks(static_cast<int>(i));
    if (b.block_hash() != hashes[i]) {
      bad = BadReply("regions out of order");
    } else if (!b.found()) {
      continue;
    } else if (absl::Status region = path.CheckRegion(b.offset(), b.block_bytes()); region.ok()) {
      regions.push_back({.index = static_cast<uint32_t>(regions.size()),
                         .offset = b.offset(),
                         .length = b.block_bytes(),
                         .bytes = {}});
      found.push_back(i);
    } else {
      bad = BadReply(region.message());
    }
  }
  const bool any = !regions.empty();
  if (bad.ok() && any && acquired.lease_id() == 0) bad = BadReply("pins without a lease");
  absl::StatusOr<LeaseGrant> grant = GrantOf(acquired, path.keyed());
  if (bad.ok() && !grant.ok()) bad = grant.status();
  if (!bad.ok()) {
    if (acquired.lease_id() != 0) Release(path, acquired.lease_id());
    return bad;
  }
  if (!any) return absl::OkStatus();
  std::vector<std::string> bytes(regions.size());
  absl::StatusOr<std::vector<uint64_t>> checksums = path.Read(*grant, regions, bytes);
  // The copies are good only if the pins held throughout; past half the lease time they may
  // not have (the release is not waited for: one round trip less per get).
  const bool held = LeaseHeld(sent);
  Release(path, acquired.lease_id());
  if (!checksums.ok()) return checksums.status();
  if (!held) return absl::AbortedError("cache store arena: the pins may have expired");
  int corrupt = 0;
  for (size_t j = 0; j < found.size(); ++j) {
    const tandem::v1::ShmBlockRegion& b = acquired.blocks(static_cast<int>(found[j]));
    if ((*checksums)[j] != b.checksum()) ++corrupt;
    tiers[found[j]] = FromProto(b.tier());
    out[found[j]] = std::move(bytes[j]);
  }
  if (corrupt > 0) {
    for (size_t i : found) out[i].reset();
    return absl::DataLossError(
        absl::StrCat("cache store arena: ", corrupt, " blocks do not match their checksums"));
  }
  return absl::OkStatus();
}

void ArenaClient::ReleaseNow(ArenaPath& path, uint64_t lease_id) {
  tandem::v1::ReleaseShmRequest request;
  request.set_instance_id(path.instance_id());
  request.set_lease_id(lease_id);
  tandem::v1::ReleaseShmResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  stub_.ReleaseShm(&context, request, &response);  // a lease that expired already is NotFound
}

void ArenaClient::Release(ArenaPath& path, uint64_t lease_id) {
  struct Call {
    grpc::ClientContext context;
    tandem::v1::ReleaseShmRequest request;
    tandem::v1::ReleaseShmResponse response;
  };
  auto* call = new Call;
  call->request.set_instance_id(path.instance_id());
  call->request.set_lease_id(lease_id);
  SetDeadline(call->context);
  {
    absl::MutexLock lock(&releases_mu_);
    ++releases_in_flight_;
  }
  stub_.async()->ReleaseShm(&call->context, &call->request, &call->response,
                            [this, call](const grpc::Status&) {
                              delete call;
                              absl::MutexLock lock(&releases_mu_);
                              --releases_in_flight_;
                            });
}

}  // namespace tandem::store
