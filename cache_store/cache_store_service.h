// gRPC face of one cache-store shard (proto/tandem/v1/cache_store.proto) over a BlockStore,
// with the callback API: Put reads a client stream of chunks, Get writes one, and a block being
// sent stays pinned until its last chunk is written.
#pragma once

#include <cstdint>

#include "cache_store/block_store.h"
#include "tandem/v1/cache_store.grpc.pb.h"

namespace tandem::cache_store {

class CacheStoreService final : public tandem::v1::CacheStore::CallbackService {
 public:
  // `chunk_bytes`: data bytes per streamed Get message. The store must outlive the service.
  CacheStoreService(BlockStore& store, int64_t chunk_bytes);

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

 private:
  BlockStore& store_;
  const int64_t chunk_bytes_;
};

}  // namespace tandem::cache_store
