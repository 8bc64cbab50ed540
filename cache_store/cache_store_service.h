// gRPC face of one cache-store shard (proto/tandem/v1/cache_store.proto) over a BlockStore,
// with the callback API: Put reads a client stream of chunks, Get writes one, and a block being
// sent stays pinned until its last chunk is written. The shared-memory calls go to a
// ShmHandoff (shm_handoff.h); so do the fabric's leases, whose bytes a UcxDataPlane moves
// (ucx_data_plane.h) when EnableFabric started one.
#pragma once

#include <cstdint>
#include <memory>

#include "cache_store/block_store.h"
#include "cache_store/shm_handoff.h"
#include "cache_store/ucx_data_plane.h"
#include "common/security/authorizer.h"
#include "tandem/v1/cache_store.grpc.pb.h"

namespace tandem::cache_store {

class CacheStoreService final : public tandem::v1::CacheStore::CallbackService {
 public:
  // `chunk_bytes`: data bytes per streamed Get message. The store must outlive the service.
  // `authorizer` (which must outlive the service) decides which roles may call what.
  CacheStoreService(BlockStore& store, int64_t chunk_bytes, const ShmHandoffOptions& shm = {},
                    const security::Authorizer& authorizer = security::Authorizer::Open());

  grpc::ServerReadReactor<tandem::v1::PutRequest>* Put(grpc::CallbackServerContext* context,
                                                       tandem::v1::PutResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::GetResponse>* Get(
      grpc::CallbackServerContext* context, const tandem::v1::GetRequest* request) override;
  grpc::ServerUnaryReactor* Exists(grpc::CallbackServerContext* context,
                                   const tandem::v1::ExistsRequest* request,
                                   tandem::v1::ExistsResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const tandem::v1::GetStatsRequest* request,
                                     tandem::v1::StoreStats* response) override;

  grpc::ServerUnaryReactor* AttachSharedMemory(
      grpc::CallbackServerContext* context, const tandem::v1::AttachSharedMemoryRequest* request,
      tandem::v1::AttachSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* ReserveShm(grpc::CallbackServerContext* context,
                                       const tandem::v1::ReserveShmRequest* request,
                                       tandem::v1::ReserveShmResponse* response) override;
  grpc::ServerUnaryReactor* CommitShm(grpc::CallbackServerContext* context,
                                      const tandem::v1::CommitShmRequest* request,
                                      tandem::v1::CommitShmResponse* response) override;
  grpc::ServerUnaryReactor* AcquireShm(grpc::CallbackServerContext* context,
                                       const tandem::v1::AcquireShmRequest* request,
                                       tandem::v1::AcquireShmResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseShm(grpc::CallbackServerContext* context,
                                       const tandem::v1::ReleaseShmRequest* request,
                                       tandem::v1::ReleaseShmResponse* response) override;

  grpc::ServerUnaryReactor* AttachFabric(grpc::CallbackServerContext* context,
                                         const tandem::v1::AttachFabricRequest* request,
                                         tandem::v1::AttachFabricResponse* response) override;

  // Starts the UCX data plane over the arena on `transports` (UcxWorkerOptions::transports;
  // UcxDataPlane::Create's errors). Before serving.
  absl::Status EnableFabric(const std::string& transports = "");

  const ShmHandoff& shm() const { return shm_; }
  // Null until EnableFabric.
  const UcxDataPlane* fabric() const { return fabric_.get(); }

 private:
  BlockStore& store_;
  const int64_t chunk_bytes_;
  ShmHandoff shm_;
  std::unique_ptr<UcxDataPlane> fabric_;  // after shm_: its transfers borrow shm_'s leases
  const security::Authorizer& authorizer_;
};

}  // namespace tandem::cache_store
