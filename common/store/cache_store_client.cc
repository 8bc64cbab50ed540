#include "common/store/cache_store_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/rpc/status.h"
#include "common/store/block_checksum.h"
#include "common/util/status_macros.h"

namespace tandem::store {
namespace {

uint32_t Checksum(const std::string& bytes) {
  return BlockChecksum({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

}  // namespace

CacheStoreClient::CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                                   const CacheStoreClientOptions& options)
    : channel_(channel),
      stub_(tandem::v1::CacheStore::NewStub(channel)),
      model_id_(std::move(model_id)),
      chunk_bytes_(std::max<int64_t>(options.chunk_bytes, 1)),
      timeout_(options.timeout),
      on_transfer_(options.on_transfer) {
  if (options.shared_memory) {
    arenas_.push_back(
        std::make_unique<ArenaClient>(*stub_, model_id_, timeout_, ArenaTransport::kSharedMemory));
  }
  if (options.fabric) {
    arenas_.push_back(std::make_unique<ArenaClient>(
        *stub_, model_id_, timeout_, ArenaTransport::kFabric, options.fabric_client));
  }
}

void CacheStoreClient::Connect() {
  channel_->GetState(/*try_to_connect=*/true);
  for (const auto& arena : arenas_) {
    if (arena->Connect()) return;  // the paths after it serve only when it does not
  }
}

bool CacheStoreClient::Attached(ArenaTransport transport) const {
  for (const auto& arena : arenas_) {
    if (arena->transport() == transport) return arena->attached();
  }
  return false;
}

void CacheStoreClient::Report(const TransferSample& sample) const {
  if (on_transfer_ && (sample.bytes > 0 || !sample.ok)) on_transfer_(sample);
}

CacheStoreClient::CacheStoreClient(std::shared_ptr<grpc::Channel> channel, std::string model_id,
                                   int64_t chunk_bytes, std::chrono::milliseconds timeout)
    : CacheStoreClient(std::move(channel), std::move(model_id),
                       CacheStoreClientOptions{.chunk_bytes = chunk_bytes,
                                               .timeout = timeout,
                                               .shared_memory = false,
                                               .fabric = false,
                                               .on_transfer = {}}) {}

void CacheStoreClient::SetDeadline(grpc::ClientContext& context) const {
  context.set_deadline(std::chrono::system_clock::now() + timeout_);
}

absl::StatusOr<PutResult> CacheStoreClient::Put(std::span<const BlockData> blocks,
                                                ArenaClient::Reservation* reservation) {
  for (const BlockData& block : blocks) {
    if (block.bytes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("block ", block.hash, " is empty"));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const auto report = [&](const char* transport, const absl::StatusOr<PutResult>& result) {
    Report({.transport = transport,
            .put = true,
            .ok = result.ok(),
            .blocks = result.ok() ? result->stored : static_cast<int>(blocks.size()),
            .bytes = result.ok() ? result->bytes : 0,
            .seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
  };
  for (const auto& arena : arenas_) {
    std::optional<absl::StatusOr<PutResult>> result =
        reservation != nullptr ? arena->PutReserved(*reservation, blocks) : std::nullopt;
    if (!result) result = arena->Put(blocks);
    if (result) {
      report(ArenaTransportName(arena->transport()), *result);
      return *std::move(result);
    }
  }
  absl::StatusOr<PutResult> result = StreamPut(blocks);
  report("grpc", result);
  return result;
}

std::unique_ptr<ArenaClient::Reservation> CacheStoreClient::Reserve(
    std::span<const BlockSize> blocks) {
  for (const BlockSize& block : blocks) {
    if (block.bytes <= 0) return nullptr;  // Put refuses it
  }
  for (const auto& arena : arenas_) {
    if (auto reserved = arena->Reserve(blocks)) return reserved;
  }
  return nullptr;
}

absl::StatusOr<PutResult> CacheStoreClient::StreamPut(std::span<const BlockData> blocks) {
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::PutResponse response;
  auto writer = stub_->Put(&context, &response);
  tandem::v1::PutRequest msg;
  for (const BlockData& block : blocks) {
    const int64_t size = static_cast<int64_t>(block.bytes.size());
    for (int64_t off = 0; off < size; off += chunk_bytes_) {
      msg.Clear();
      msg.set_block_hash(block.hash);
      if (off == 0) {
        msg.set_model_id(model_id_);
        msg.set_block_bytes(size);
        msg.set_checksum(Checksum(block.bytes));
      }
      const int64_t n = std::min(chunk_bytes_, size - off);
      msg.set_data(block.bytes.data() + off, n);
      if (!writer->Write(msg)) break;  // the server ended the call; Finish says why
    }
  }
  writer->WritesDone();
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(writer->Finish()));
  int64_t bytes = 0;
  for (const BlockData& block : blocks) bytes += static_cast<int64_t>(block.bytes.size());
  return PutResult{.stored = response.stored(), .skipped = response.skipped(), .bytes = bytes};
}

absl::StatusOr<std::vector<std::optional<std::string>>> CacheStoreClient::Get(
    std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers) {
  if (tiers != nullptr) tiers->assign(hashes.size(), StoreTier::kNone);
  const auto start = std::chrono::steady_clock::now();
  const auto report = [&](const char* transport, const GetResult& result) {
    TransferSample sample{.transport = transport, .ok = result.ok()};
    if (result.ok()) {
      for (const std::optional<std::string>& block : *result) {
        if (!block) continue;
        ++sample.blocks;
        sample.bytes += static_cast<int64_t>(block->size());
      }
    }
    sample.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Report(sample);
  };
  for (const auto& arena : arenas_) {
    if (std::optional<GetResult> result = arena->Get(hashes, tiers)) {
      report(ArenaTransportName(arena->transport()), *result);
      return *std::move(result);
    }
  }
  GetResult result = StreamGet(hashes, tiers);
  report("grpc", result);
  return result;
}

absl::StatusOr<std::vector<std::optional<std::string>>> CacheStoreClient::StreamGet(
    std::span<const uint64_t> hashes, std::vector<StoreTier>* tiers) {
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::GetRequest request;
  request.set_model_id(model_id_);
  for (uint64_t h : hashes) request.add_block_hashes(h);
  auto reader = stub_->Get(&context, request);
  std::vector<std::optional<std::string>> out(hashes.size());
  size_t index = 0;
  int64_t expected = -1;  // bytes of the block being received; -1 between blocks
  uint32_t checksum = 0;
  tandem::v1::GetResponse msg;
  while (reader->Read(&msg)) {
    if (index == hashes.size() || msg.block_hash() != hashes[index]) {
      context.TryCancel();
      reader->Finish();
      return absl::InternalError(
          absl::StrCat("cache store sent block ", msg.block_hash(), " out of order"));
    }
    if (expected < 0) {
      if (!msg.found()) {
        ++index;
        continue;
      }
      expected = msg.block_bytes();
      checksum = msg.checksum();
      out[index].emplace().reserve(expected);
      if (tiers != nullptr) (*tiers)[index] = FromProto(msg.tier());
    }
    std::string& bytes = *out[index];
    bytes.append(msg.data());
    if (static_cast<int64_t>(bytes.size()) >= expected) {
      if (static_cast<int64_t>(bytes.size()) != expected || Checksum(bytes) != checksum) {
        context.TryCancel();
        reader->Finish();
        return absl::DataLossError(absl::StrCat("block ", hashes[index], ": corrupt transfer"));
      }
      expected = -1;
      ++index;
    }
  }
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(reader->Finish()));
  if (index != hashes.size() || expected >= 0) {
    return absl::InternalError("cache store ended the stream early");
  }
  return out;
}

absl::StatusOr<std::vector<bool>> CacheStoreClient::Exists(std::span<const uint64_t> hashes) {
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::ExistsRequest request;
  request.set_model_id(model_id_);
  for (uint64_t h : hashes) request.add_block_hashes(h);
  tandem::v1::ExistsResponse response;
  TANDEM_RETURN_IF_ERROR(rpc::FromGrpcStatus(stub_->Exists(&context, request, &response)));
  if (response.present_size() != static_cast<int>(hashes.size())) {
    return absl::InternalError("cache store answered Exists for the wrong number of blocks");
  }
  return std::vector<bool>(response.present().begin(), response.present().end());
}

absl::StatusOr<tandem::v1::StoreStats> CacheStoreClient::Stats() {
  grpc::ClientContext context;
  SetDeadline(context);
  tandem::v1::StoreStats stats;
  TANDEM_RETURN_IF_ERROR(
      rpc::FromGrpcStatus(stub_->GetStats(&context, tandem::v1::GetStatsRequest(), &stats)));
  return stats;
}

}  // namespace tandem::store
