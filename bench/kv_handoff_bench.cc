// kv-handoff-bench: KV block handoff GB/s, prefill -> store -> decode, through the gRPC stream,
// the node-local shared-memory path and the UCX fabric (over TCP and over UCX's shared memory),
// beside memcpy of the same bytes on this machine. A real shard (BlockStore + CacheStoreService)
// serves on loopback in this process; clients are CacheStoreClient as workers use it. Variants are
// interleaved within each repetition so machine noise hits them alike; medians are printed as a
// Markdown table.
//
//   kv-handoff-bench [--block-sizes 64Ki,1Mi] [--total 64Mi] [--request 8Mi] [--reps 7]
//                    [--chunk 1Mi] [--no-stream] [--default-malloc] [--certs DIR]
//                    [--shard HOST:PORT] [--paths grpc,shm,shm-reserved,ucx-tcp,ucx-sm]
//   kv-handoff-bench --profile P.json [--profile-requests 256Ki,2Mi,16Mi] [--reps 7]
//                    [--shard HOST:PORT]
//
// --shard measures against a `tandem cache-store` process of its own on this node (as workers
// reach a shard) instead of one in this process: the shard's copies and RPC threads then run
// in another process, scheduled as in a deployment. Its cache_store.capacity_bytes must hold
// --total plus two requests, and its block limit the block size.
//
// --paths measures only the paths named (memcpy always), to profile one of them alone.
//
// --profile fills an engine profile's kv_transfer samples (common/planner/profile.h): blocks of
// the profiled model's size, one sample per request size and path (grpc, shm, and ucx from UCX
// over TCP, the fabric between machines without RDMA), the file rewritten in place. With
// --paths only those paths' samples are replaced; the profile keeps the others.
//
// With --certs (a directory scripts/dev-certs.sh made) the shard also serves a mutual-TLS port
// and both paths are measured through it too: the stream's bytes are encrypted, the shared
// memory path's control calls are.
//
// Each request puts `request` bytes of fresh blocks (a prompt's worth) and gets them back into
// new strings, as StorePool::Get returns them. "put+get" is bytes handed off per second of both
// halves: two copies where memcpy does one, so 50% of memcpy is its ceiling even without
// checksums. The process is tuned as `tandem` tunes its own (TuneServingProcess: freed heap is
// kept, so those strings reuse faulted-in pages as memcpy's buffers do); --default-malloc
// measures with glibc's defaults instead.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cache_store/block_store.h"
#include "cache_store/cache_store_service.h"
#include "common/planner/profile.h"
#include "common/security/authorizer.h"
#include "common/security/transport.h"
#include "common/store/cache_store_client.h"
#include "common/store/ucx_client.h"
#include "common/util/cli_args.h"
#include "common/util/file_util.h"
#include "common/util/process_tuning.h"
#include "common/util/status_macros.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Options {
  std::vector<int64_t> block_sizes;
  int64_t total = int64_t{64} << 20;
  int64_t request = int64_t{8} << 20;
  int reps = 7;
  int64_t chunk = 1 << 20;
  bool stream = true;  // run the gRPC-stream variant (--no-stream: profile the others alone)
  std::vector<std::string> paths;  // --paths; empty: all
  bool tuned = true;  // TuneServingProcess
  std::string certs;  // scripts/dev-certs.sh output; empty: no TLS rows
  std::string shard;  // a `tandem cache-store` to measure against; empty: one in this process
  // --profile: where each run adds a sample per path (plaintext gRPC stream, shared memory).
  std::vector<planner::TransferSample>* samples = nullptr;
};

struct Timing {
  double put = 0;  // seconds for all requests' puts
  double get = 0;
};

// The bytes of `total / block` blocks, distinct per block, standing for a prefill's export.
std::vector<store::BlockData> MakeBlocks(int64_t block, int64_t total) {
  std::vector<store::BlockData> blocks(std::max<int64_t>(total / block, 1));
  uint64_t x = 0x9e3779b97f4a7c15;
  for (auto& b : blocks) {
    b.bytes.resize(block);
    for (int64_t i = 0; i + 8 <= block; i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(b.bytes.data() + i, &x, 8);
    }
  }
  return blocks;
}

// Worker buffer to worker buffer, block by block: the one copy a handoff cannot avoid.
double TimeMemcpy(const std::vector<store::BlockData>& blocks, std::vector<std::string>& dst) {
  const auto t0 = Clock::now();
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::memcpy(dst[i].data(), blocks[i].bytes.data(), blocks[i].bytes.size());
  }
  return Seconds(t0);
}

// Puts then gets every request's blocks under fresh hashes, so each put stores. With
// `reserve_ahead`, each request's space is reserved first, outside the timing, as a prefill
// worker reserves it while its engine computes (cache_store.reserve_ahead): the put is then the
// copy and one Commit.
absl::StatusOr<Timing> TimeHandoff(store::CacheStoreClient& client,
                                   std::vector<store::BlockData>& blocks, size_t per_request,
                                   uint64_t& next_hash, bool reserve_ahead = false) {
  Timing t;
  for (size_t begin = 0; begin < blocks.size(); begin += per_request) {
    const size_t n = std::min(per_request, blocks.size() - begin);
    std::span<store::BlockData> request(blocks.data() + begin, n);
    std::vector<uint64_t> hashes;
    std::vector<store::BlockSize> sizes;
    for (auto& b : request) {
      hashes.push_back(b.hash = next_hash++);
      sizes.push_back({b.hash, static_cast<int64_t>(b.bytes.size())});
    }
    std::unique_ptr<store::ArenaClient::Reservation> reservation;
    if (reserve_ahead) {
      reservation = client.Reserve(sizes);
      if (reservation == nullptr) return absl::InternalError("no reservation made ahead");
    }
    auto t0 = Clock::now();
    TANDEM_ASSIGN_OR_RETURN(store::PutResult put, client.Put(request, reservation.get()));
    t.put += Seconds(t0);
    if (put.stored != static_cast<int>(n)) {
      return absl::InternalError(absl::StrCat("stored ", put.stored, " of ", n));
    }
    if (reserve_ahead && !put.ahead) return absl::InternalError("the reservation went unused");
    t0 = Clock::now();
    TANDEM_ASSIGN_OR_RETURN(auto got, client.Get(hashes));
    t.get += Seconds(t0);
    for (size_t i = 0; i < n; ++i) {
      if (!got[i] || got[i]->size() != request[i].bytes.size()) {
        return absl::InternalError("a block came back missing or short");
      }
    }
  }
  return t;
}

struct Row {
  std::string variant;
  std::vector<double> put, get, both;  // GB/s per repetition
};

absl::Status RunBlockSize(const Options& o, int64_t block, std::vector<std::string>& table) {
  // The shard: in this process (a BlockStore behind CacheStoreService on loopback), or with
  // --shard a `tandem cache-store` process of its own on this node, as workers reach one.
  std::unique_ptr<cache_store::BlockStore> store;
  if (o.shard.empty()) {
    TANDEM_ASSIGN_OR_RETURN(
        store, cache_store::BlockStore::Create(
                   {.capacity_bytes = o.total + 2 * o.request, .max_block_bytes = block}));
    if (store->arena() == nullptr) return absl::UnavailableError("no shared-memory arena");
  }
  // With --certs: the shard's and the prefill worker's certificates, as roles use them.
  std::shared_ptr<const security::Transport> shard_tls, worker_tls;
  if (!o.certs.empty()) {
    const auto role = [&](const std::string& name) {
      return security::Transport::Create({.ca_file = o.certs + "/ca.pem",
                                          .cert_file = o.certs + "/" + name + ".pem",
                                          .key_file = o.certs + "/" + name + ".key"});
    };
    TANDEM_ASSIGN_OR_RETURN(shard_tls, role("cache_store"));
    TANDEM_ASSIGN_OR_RETURN(worker_tls, role("prefill"));
  }
  // The shard's store behind two servers: plaintext, and (with --certs) mutual TLS with the
  // role check a TLS shard makes.
  std::unique_ptr<cache_store::CacheStoreService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address = o.shard;
  int tls_port = 0;
  if (store != nullptr) {
    service = std::make_unique<cache_store::CacheStoreService>(*store, o.chunk);
    TANDEM_RETURN_IF_ERROR(service->EnableFabric());  // every transport UCX has here
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    if (server == nullptr) return absl::UnavailableError("cannot start the shard");
    address = absl::StrCat("127.0.0.1:", port);
  }
  std::unique_ptr<security::Authorizer> authorizer;
  std::unique_ptr<cache_store::CacheStoreService> tls_service;
  std::unique_ptr<grpc::Server> tls_server;
  if (shard_tls) {
    authorizer = std::make_unique<security::Authorizer>(shard_tls, nullptr);
    tls_service = std::make_unique<cache_store::CacheStoreService>(
        *store, o.chunk, cache_store::ShmHandoffOptions{}, *authorizer);
    grpc::ServerBuilder tls_builder;
    tls_builder.AddListeningPort(
        "127.0.0.1:0", shard_tls->ServerCredentials(security::ClientCertificates::kRequire),
        &tls_port);
    tls_builder.RegisterService(tls_service.get());
    tls_server = tls_builder.BuildAndStart();
    if (tls_server == nullptr) return absl::UnavailableError("cannot start the TLS shard");
  }
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  store::CacheStoreClient grpc_client(channel, "bench", {.chunk_bytes = o.chunk});
  store::CacheStoreClient shm_client(channel, "bench",
                                     {.chunk_bytes = o.chunk, .shared_memory = true});
  // The fabric, once over each of UCX's transports on one node: TCP and shared memory.
  TANDEM_ASSIGN_OR_RETURN(auto ucx_tcp, store::UcxKvClient::Create("tcp,self"));
  TANDEM_ASSIGN_OR_RETURN(auto ucx_sm, store::UcxKvClient::Create("sm,self"));
  store::CacheStoreClient ucx_tcp_client(
      channel, "bench", {.chunk_bytes = o.chunk, .fabric = true, .fabric_client = ucx_tcp});
  store::CacheStoreClient ucx_sm_client(
      channel, "bench", {.chunk_bytes = o.chunk, .fabric = true, .fabric_client = ucx_sm});
  std::unique_ptr<store::CacheStoreClient> tls_grpc_client, tls_shm_client;
  if (shard_tls) {
    auto tls_channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", tls_port),
                            worker_tls->ChannelCredentials(security::Role::kCacheStore));
    tls_grpc_client = std::make_unique<store::CacheStoreClient>(
        tls_channel, "bench", store::CacheStoreClientOptions{.chunk_bytes = o.chunk});
    tls_shm_client = std::make_unique<store::CacheStoreClient>(
        tls_channel, "bench",
        store::CacheStoreClientOptions{.chunk_bytes = o.chunk, .shared_memory = true});
  }

  std::vector<store::BlockData> blocks = MakeBlocks(block, o.total);
  const double bytes = static_cast<double>(blocks.size()) * block;
  const size_t per_request = std::max<size_t>(o.request / block, 1);
  std::vector<std::string> dst(blocks.size(), std::string(block, '\0'));
  uint64_t next_hash = 1;
  Row memcpy_row{"memcpy", {}, {}, {}};  // the names below are --paths'
  Row grpc_row{"gRPC stream", {}, {}, {}};
  Row shm_row{"shared memory", {}, {}, {}};
  Row ahead_row{"shm, reserved", {}, {}, {}};
  Row tls_grpc_row{"gRPC, TLS", {}, {}, {}};
  Row tls_shm_row{"shm, TLS", {}, {}, {}};
  Row ucx_tcp_row{"UCX, tcp", {}, {}, {}};
  Row ucx_sm_row{"UCX, sm", {}, {}, {}};
  struct Variant {
    Row* row;
    store::CacheStoreClient* client;  // null: memcpy
    std::string path;                 // its name in --paths
    bool reserve_ahead = false;
    bool stream = false;  // skipped with --no-stream
  };
  std::vector<Variant> variants = {{&memcpy_row, nullptr, "memcpy"},
                                   {&grpc_row, &grpc_client, "grpc", false, true},
                                   {&shm_row, &shm_client, "shm"},
                                   {&ahead_row, &shm_client, "shm-reserved", true},
                                   {&ucx_tcp_row, &ucx_tcp_client, "ucx-tcp"},
                                   {&ucx_sm_row, &ucx_sm_client, "ucx-sm"}};
  if (shard_tls) {
    variants.push_back({&tls_grpc_row, tls_grpc_client.get(), "grpc-tls", false, true});
    variants.push_back({&tls_shm_row, tls_shm_client.get(), "shm-tls"});
  }
  std::erase_if(variants, [&o](const Variant& v) {
    return v.client != nullptr && ((v.stream && !o.stream) ||
                                   (!o.paths.empty() && std::find(o.paths.begin(), o.paths.end(),
                                                                  v.path) == o.paths.end()));
  });
  // Two warm-up rounds write more than the arena holds, so every page of it has been faulted in
  // (by the shard and by the client's mapping), as in a long-running shard; then connections
  // and allocator caches are warm too.
  for (int rep = -2; rep < o.reps; ++rep) {
    for (size_t k = 0; k < variants.size(); ++k) {
      const Variant& v = variants[(k + std::max(rep, 0)) % variants.size()];  // rotate the order
      if (v.client == nullptr) {
        const double s = TimeMemcpy(blocks, dst);
        if (rep >= 0) memcpy_row.both.push_back(bytes / s / 1e9);
        continue;
      }
      TANDEM_ASSIGN_OR_RETURN(
          Timing t, TimeHandoff(*v.client, blocks, per_request, next_hash, v.reserve_ahead));
      if (rep < 0) continue;
      Row& row = *v.row;
      row.put.push_back(bytes / t.put / 1e9);
      row.get.push_back(bytes / t.get / 1e9);
      row.both.push_back(bytes / (t.put + t.get) / 1e9);
    }
  }
  for (const Variant& v : variants) {
    if (v.client == nullptr || v.stream) continue;
    if (v.client == &ucx_tcp_client || v.client == &ucx_sm_client
            ? !v.client->fabric_attached()
            : !v.client->shared_memory_attached()) {
      return absl::InternalError(absl::StrCat("the ", v.path, " client fell back to the stream"));
    }
  }
  if (o.samples != nullptr) {
    // One transfer (a put or a get) of a request's bytes: half the put+get time per request.
    const double request_bytes = static_cast<double>(per_request * block);
    for (const auto& [transport, row] :
         {std::pair{"grpc", &grpc_row}, {"shm", &shm_row}, {"ucx", &ucx_tcp_row}}) {
      if (row->both.empty()) continue;
      o.samples->push_back({transport, static_cast<int64_t>(request_bytes),
                            request_bytes / (Median(row->both) * 1e9) / 2});
    }
  }
  const double base = Median(memcpy_row.both);
  const std::string name =
      block >= (1 << 20) ? absl::StrCat(block >> 20, " MiB") : absl::StrCat(block >> 10, " KiB");
  for (const Row* row : {&memcpy_row, &grpc_row, &tls_grpc_row, &shm_row, &ahead_row, &tls_shm_row,
                         &ucx_tcp_row, &ucx_sm_row}) {
    if (row->both.empty()) continue;
    auto cell = [base](const std::vector<double>& v) {
      if (v.empty()) return std::string("-");
      return absl::StrFormat("%.2f (%.0f%%)", Median(v), 100 * Median(v) / base);
    };
    table.push_back(absl::StrFormat("| %7s | %-13s | %12s | %12s | %12s |", name, row->variant,
                                    cell(row->put), cell(row->get), cell(row->both)));
  }
  if (server != nullptr) server->Shutdown();
  if (tls_server != nullptr) tls_server->Shutdown();
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  TANDEM_ASSIGN_OR_RETURN(CliArgs args,
                          CliArgs::Parse(argc, argv, {"no-stream", "default-malloc"}));
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"block-sizes", "total", "request", "reps", "chunk",
                                          "no-stream", "default-malloc", "certs", "profile",
                                          "profile-requests", "shard", "paths"}));
  Options o;
  o.certs = args.StringOr("certs", "");
  o.shard = args.StringOr("shard", "");
  if (!o.shard.empty() && !o.certs.empty()) {
    return absl::InvalidArgumentError(
        "--certs serves TLS from a shard in this process; with --shard, give the shard TLS in "
        "its own configuration");
  }
  o.stream = !args.Has("no-stream");
  o.paths = absl::StrSplit(args.StringOr("paths", ""), ',', absl::SkipEmpty());
  for (const std::string& p : o.paths) {
    static const std::vector<std::string> kPaths = {"grpc",   "shm",      "shm-reserved", "ucx-tcp",
                                                    "ucx-sm", "grpc-tls", "shm-tls"};
    if (std::find(kPaths.begin(), kPaths.end(), p) == kPaths.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--paths: no path named '", p, "'"));
    }
  }
  o.tuned = !args.Has("default-malloc");
  if (o.tuned) TuneServingProcess();
  const std::vector<std::string> sizes =
      absl::StrSplit(args.StringOr("block-sizes", "64Ki,1Mi"), ',', absl::SkipEmpty());
  for (const std::string& s : sizes) {
    TANDEM_ASSIGN_OR_RETURN(int64_t b, ParseByteSize(s));
    if (b <= 0) return absl::InvalidArgumentError("--block-sizes must be positive");
    o.block_sizes.push_back(b);
  }
  TANDEM_ASSIGN_OR_RETURN(o.total, args.BytesOr("total", o.total));
  TANDEM_ASSIGN_OR_RETURN(o.request, args.BytesOr("request", o.request));
  TANDEM_ASSIGN_OR_RETURN(int64_t reps, args.IntOr("reps", o.reps));
  TANDEM_ASSIGN_OR_RETURN(o.chunk, args.BytesOr("chunk", o.chunk));
  o.reps = static_cast<int>(std::max<int64_t>(reps, 1));
  std::printf(
      "KV handoff: %lld MiB per repetition in %lld MiB requests, median of %d, %s; "
      "GB/s = 1e9 bytes/s, %% = of memcpy\n\n",
      static_cast<long long>(o.total >> 20), static_cast<long long>(o.request >> 20), o.reps,
      o.tuned ? "process tuned as tandem's" : "default malloc");
  std::vector<std::string> table = {
      "|   block | path          |     put GB/s |     get GB/s | put+get GB/s |",
      "|--------:|:--------------|-------------:|-------------:|-------------:|"};
  if (args.Has("profile")) {
    // The profile's model fixes the block size; each request size adds a sample per path.
    TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("profile"));
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
    TANDEM_ASSIGN_OR_RETURN(planner::EngineProfile profile,
                            planner::EngineProfile::FromJson(text, path));
    const int64_t block = profile.kv_bytes_per_token * profile.block_size;
    std::vector<planner::TransferSample> samples;
    o.samples = &samples;
    const std::vector<std::string> requests =
        absl::StrSplit(args.StringOr("profile-requests", "256Ki,2Mi,16Mi"), ',', absl::SkipEmpty());
    int64_t previous = 0;
    for (const std::string& s : requests) {
      TANDEM_ASSIGN_OR_RETURN(o.request, ParseByteSize(s));
      if (o.request <= 0) return absl::InvalidArgumentError("--profile-requests: not positive");
      // A request carries whole blocks: one below a block (a large model's) is one block.
      o.request = std::max(o.request, block);
      if (o.request == previous) continue;
      previous = o.request;
      o.total = std::max(o.total, 4 * o.request);
      TANDEM_RETURN_IF_ERROR(RunBlockSize(o, block, table));
    }
    for (const std::string& line : table) std::printf("%s\n", line.c_str());
    // The transports measured now replace theirs; the others' samples stay.
    std::erase_if(profile.transfer, [&samples](const planner::TransferSample& old) {
      return std::any_of(samples.begin(), samples.end(), [&old](const planner::TransferSample& t) {
        return t.transport == old.transport;
      });
    });
    for (planner::TransferSample& t : samples) profile.transfer.push_back(std::move(t));
    return WriteStringToFile(path, profile.ToJson() + "\n");
  }
  for (int64_t block : o.block_sizes) TANDEM_RETURN_IF_ERROR(RunBlockSize(o, block, table));
  for (const std::string& line : table) std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  absl::Status s = tandem::bench::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "kv-handoff-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
