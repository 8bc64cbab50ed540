#include "common/store/shm_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/rpc/status.h"
#include "common/store/block_checksum.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tandem::store {
namespace {

constexpr std::chrono::seconds kAttachRetry(5);
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
  return absl::InternalError(absl::StrCat("cache store shared memory: ", what));
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

ShmClient::ShmClient(tandem::v1::CacheStore::StubInterface& stub, std::string model_id,
                     std::chrono::milliseconds timeout)
    : stub_(stub), model_id_(std::move(model_id)), timeout_(timeout) {}

ShmClient::~ShmClient() {
  absl::MutexLock lock(&releases_mu_);
  releases_mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &releases_in_flight_));
}

void ShmClient::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(std::chrono::system_clock::now() + timeout_);
}

bool ShmClient::attached() const {
  absl::MutexLock lock(&mu_);
  return mapping_ != nullptr;
}

ShmClient::Mapping ShmClient::Attach() {
  {
    absl::MutexLock lock(&mu_);
    if (mapping_ != nullptr) return mapping_;
    if (Clock::now() < retry_after_) return nullptr;
  }
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::AttachSharedMemoryResponse response;
  absl::Status s = rpc::FromGrpcStatus(
      stub_.AttachSharedMemory(&context, tandem::v1::AttachSharedMemoryRequest(), &response));
  absl::StatusOr<std::unique_ptr<ShmMapping>> opened =
      s.ok() ? ShmMapping::Open(response.path(), response.file_bytes(), response.instance_id()) : s;
  absl::MutexLock lock(&mu_);
  if (!opened.ok()) {
    retry_after_ = Clock::now() + kAttachRetry;
    // Offered but not reachable (another machine or mount namespace): worth saying, once.
    if (s.ok() && !std::exchange(warned_, true)) {
      Log(LogLevel::kWarning, "cache-store-client",
          absl::StrCat(opened.status().ToString(), "; streaming instead"));
    }
    return nullptr;
  }
  if (mapping_ == nullptr) {
    mapping_ = *std::move(opened);
    lease_ = std::chrono::milliseconds(response.lease_ms());
  }
  return mapping_;
}

void ShmClient::Detach(const Mapping& mapping) {
  absl::MutexLock lock(&mu_);
  if (mapping_ == mapping) mapping_ = nullptr;  // unmapped when its last user is done
}

template <typename T>
std::optional<absl::StatusOr<T>> ShmClient::Failed(const Mapping& mapping,
                                                   const absl::Status& status) {
  if (ArenaGone(status)) Detach(mapping);
  if (absl::IsFailedPrecondition(status)) return std::nullopt;
  return absl::StatusOr<T>(status);
}

std::optional<absl::StatusOr<PutResult>> ShmClient::Put(std::span<const BlockData> blocks) {
  Mapping mapping = Attach();
  if (mapping == nullptr) return std::nullopt;
  const int64_t max_bytes = std::min(kMaxBatchBytes, mapping->size() / 4);
  PutResult total;
  for (size_t begin = 0; begin < blocks.size();) {
    size_t end = begin + 1;
    int64_t bytes = static_cast<int64_t>(blocks[begin].bytes.size());
    while (end < blocks.size() && end - begin < kMaxBatchBlocks &&
           bytes + static_cast<int64_t>(blocks[end].bytes.size()) <= max_bytes) {
      bytes += static_cast<int64_t>(blocks[end++].bytes.size());
    }
    absl::StatusOr<PutResult> r = PutBatch(*mapping, blocks.subspan(begin, end - begin));
    if (!r.ok()) return Failed<PutResult>(mapping, r.status());
    total.stored += r->stored;
    total.skipped += r->skipped;
    total.bytes += r->bytes;
    begin = end;
  }
  return total;
}

absl::StatusOr<PutResult> ShmClient::PutBatch(const ShmMapping& mapping,
                                              std::span<const BlockData> blocks,
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
  TANDEM_ASSIGN_OR_RETURN(const Reserved reserved, ReserveBatch(mapping, sizes));
  return CommitBatch(mapping, reserved, blocks, only);
}

absl::StatusOr<ShmClient::Reserved> ShmClient::ReserveBatch(const ShmMapping& mapping,
                                                            std::span<const BlockSize> blocks,
                                                            bool ahead) {
  tandem::v1::ReserveShmRequest request;
  request.set_instance_id(mapping.instance_id());
  request.set_model_id(model_id_);
  request.set_ahead(ahead);
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
    } else if (auto region = mapping.Region(r.offset(), blocks[i].bytes); region.ok()) {
      reserved.regions[i] = *region;
      reserved.bytes += blocks[i].bytes;
    } else {
      bad = BadReply(region.status().message());
    }
  }
  const bool any = reserved.skipped < static_cast<int>(blocks.size());
  if (bad.ok() && any && response.lease_id() == 0) bad = BadReply("reservations without a lease");
  if (!bad.ok()) {
    if (response.lease_id() != 0) Release(mapping, response.lease_id());
    return bad;
  }
  reserved.lease_id = any ? response.lease_id() : 0;
  return reserved;
}

absl::StatusOr<PutResult> ShmClient::CommitBatch(const ShmMapping& mapping,
                                                 const Reserved& reserved,
                                                 std::span<const BlockData> blocks,
                                                 std::span<const size_t> only) {
  PutResult result{.skipped = reserved.skipped, .bytes = reserved.bytes};
  if (reserved.lease_id == 0) return result;
  // The lease began after `sent`. A client this late (stalled, swapped out) must not write into
  // space the shard may already have handed to someone else.
  if (!LeaseHeld(reserved.sent)) {
    Release(mapping, reserved.lease_id);
    return absl::DeadlineExceededError("cache store shared memory: reservation too old to use");
  }
  tandem::v1::CommitShmRequest commit;
  commit.set_instance_id(mapping.instance_id());
  commit.set_lease_id(reserved.lease_id);
  for (size_t i = 0; i < reserved.regions.size(); ++i) {
    if (reserved.regions[i].empty()) continue;
    const BlockData& block = blocks[only.empty() ? i : only[i]];
    commit.add_checksums(CopyWithChecksum64(reserved.regions[i], Bytes(block.bytes)));
  }
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::CommitShmResponse committed;
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_.CommitShm(&context, commit, &committed)));
  result.stored = committed.stored();
  return result;
}

std::unique_ptr<ShmClient::Reservation> ShmClient::Reserve(std::span<const BlockSize> blocks) {
  Mapping mapping = Attach();
  if (mapping == nullptr || blocks.empty() || blocks.size() > kMaxBatchBlocks) return nullptr;
  int64_t bytes = 0;
  for (const BlockSize& b : blocks) bytes += b.bytes;
  if (bytes > std::min(kMaxBatchBytes, mapping->size() / 4)) return nullptr;
  absl::StatusOr<Reserved> reserved = ReserveBatch(*mapping, blocks, /*ahead=*/true);
  if (!reserved.ok()) {
    if (ArenaGone(reserved.status())) Detach(mapping);
    return nullptr;
  }
  return std::unique_ptr<Reservation>(
      new Reservation(*this, std::move(mapping), blocks, *std::move(reserved)));
}

std::optional<absl::StatusOr<PutResult>> ShmClient::PutReserved(Reservation& reservation,
                                                                std::span<const BlockData> blocks) {
  if (reservation.used_) return std::nullopt;
  const Reserved& reserved = reservation.reserved_;
  bool fits = blocks.size() == reservation.blocks_.size();
  for (size_t i = 0; fits && i < blocks.size(); ++i) {
    fits = blocks[i].hash == reservation.blocks_[i].hash &&
           static_cast<int64_t>(blocks[i].bytes.size()) == reservation.blocks_[i].bytes;
  }
  if (!fits || (reserved.lease_id != 0 && !LeaseHeld(reserved.sent))) {
    // Ended before the caller puts the usual way: while the lease holds them, the shard takes
    // its blocks for ones being written and would skip them.
    if (!std::exchange(reservation.used_, true) && reserved.lease_id != 0) {
      ReleaseNow(*reservation.mapping_, reserved.lease_id);
    }
    return std::nullopt;
  }
  reservation.used_ = true;
  absl::StatusOr<PutResult> result = CommitBatch(*reservation.mapping_, reserved, blocks);
  if (!result.ok()) return Failed<PutResult>(reservation.mapping_, result.status());
  result->ahead = true;
  if (!reserved.pending.empty()) {
    // Another writer had these at Reserve and may still be computing them: reported stored,
    // they must be. The shard skips those committed since and gives the rest space of their own.
    absl::StatusOr<PutResult> late = PutBatch(*reservation.mapping_, blocks, reserved.pending);
    if (!late.ok()) return Failed<PutResult>(reservation.mapping_, late.status());
    result->skipped -= static_cast<int>(reserved.pending.size()) - late->skipped;
    result->stored += late->stored;
    result->bytes += late->bytes;
  }
  return result;
}

ShmClient::Reservation::~Reservation() { Release(); }

void ShmClient::Reservation::Release() {
  if (std::exchange(used_, true) || reserved_.lease_id == 0) return;
  client_.Release(*mapping_, reserved_.lease_id);
}

StoreTier FromProto(tandem::v1::StoreTier tier) {
  return tier == tandem::v1::STORE_TIER_DISK ? StoreTier::kDisk : StoreTier::kMemory;
}

std::optional<absl::StatusOr<std::vector<std::optional<std::string>>>> ShmClient::Get(
    std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers) {
  using Blocks = std::vector<std::optional<std::string>>;
  Mapping mapping = Attach();
  if (mapping == nullptr) return std::nullopt;
  Blocks out(hashes.size());
  std::vector<StoreTier> found_in(hashes.size(), StoreTier::kNone);
  for (size_t begin = 0; begin < hashes.size(); begin += kMaxBatchBlocks) {
    const size_t n = std::min(kMaxBatchBlocks, hashes.size() - begin);
    absl::Status s = GetBatch(*mapping, hashes.subspan(begin, n),
                              std::span<std::optional<std::string>>(out).subspan(begin, n),
                              std::span<StoreTier>(found_in).subspan(begin, n));
    if (!s.ok()) return Failed<Blocks>(mapping, s);
  }
  if (tiers != nullptr) *tiers = std::move(found_in);
  return out;
}

absl::Status ShmClient::GetBatch(const ShmMapping& mapping, std::span<const uint64_t> hashes,
                                 std::span<std::optional<std::string>> out,
                                 std::span<StoreTier> tiers) {
  tandem::v1::AcquireShmRequest request;
  request.set_instance_id(mapping.instance_id());
  request.set_model_id(model_id_);
  for (uint64_t h : hashes) request.add_block_hashes(h);
  tandem::v1::AcquireShmResponse acquired;
  const Clock::time_point sent = Clock::now();
  {
    grpc::ClientContext context;
    SetDeadline(context);
    TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_.AcquireShm(&context, request, &acquired)));
  }
  absl::Status bad;
  std::vector<std::span<uint8_t>> regions(hashes.size());
  if (acquired.blocks_size() != static_cast<int>(hashes.size())) {
    bad = BadReply("regions for the wrong number of blocks");
  }
  bool any = false;
  for (size_t i = 0; bad.ok() && i < hashes.size(); ++i) {
    const tandem::v1::ShmBlockRegion& b = acquired.blocks(static_cast<int>(i));
    if (b.block_hash() != hashes[i]) {
      bad = BadReply("regions out of order");
    } else if (!b.found()) {
      continue;
    } else if (auto region = mapping.Region(b.offset(), b.block_bytes()); region.ok()) {
      regions[i] = *region;
      any = true;
    } else {
      bad = BadReply(region.status().message());
    }
  }
  if (bad.ok() && any && acquired.lease_id() == 0) bad = BadReply("pins without a lease");
  if (!bad.ok()) {
    if (acquired.lease_id() != 0) Release(mapping, acquired.lease_id());
    return bad;
  }
  int corrupt = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (regions[i].empty()) continue;
    tiers[i] = FromProto(acquired.blocks(static_cast<int>(i)).tier());
    const uint64_t checksum = AppendWithChecksum64(out[i].emplace(), regions[i]);
    if (checksum != acquired.blocks(static_cast<int>(i)).checksum()) ++corrupt;
  }
  if (!any) return absl::OkStatus();
  // The copies are good only if the pins held throughout; past half the lease time they may
  // not have (the release is not waited for: one round trip less per get).
  const bool held = LeaseHeld(sent);
  Release(mapping, acquired.lease_id());
  if (!held) return absl::AbortedError("cache store shared memory: the pins may have expired");
  if (corrupt > 0) {
    return absl::DataLossError(absl::StrCat("cache store shared memory: ", corrupt,
                                            " blocks do not match their checksums"));
  }
  return absl::OkStatus();
}

void ShmClient::ReleaseNow(const ShmMapping& mapping, uint64_t lease_id) {
  tandem::v1::ReleaseShmRequest request;
  request.set_instance_id(mapping.instance_id());
  request.set_lease_id(lease_id);
  tandem::v1::ReleaseShmResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  stub_.ReleaseShm(&context, request, &response);  // a lease that expired already is NotFound
}

void ShmClient::Release(const ShmMapping& mapping, uint64_t lease_id) {
  struct Call {
    grpc::ClientContext context;
    tandem::v1::ReleaseShmRequest request;
    tandem::v1::ReleaseShmResponse response;
  };
  auto* call = new Call;
  call->request.set_instance_id(mapping.instance_id());
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
