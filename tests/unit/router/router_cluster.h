// A router over real gRPC services on loopback, for the router's tests: a cache-store shard,
// two prefill and two decode workers on a tiny random model, each worker on its own engine.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cache_store/block_store.h"
#include "cache_store/cache_store_service.h"
#include "common/model/model_weights.h"
#include "common/store/store_pool.h"
#include "decode_worker/decode_service.h"
#include "prefill_worker/prefill_service.h"
#include "router/router_service.h"
#include "tests/unit/testing/serving.h"

namespace tandem::testing {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<tandem::v1::TokenLogprobs> logprobs;
  std::vector<int32_t> prompt_token_ids;  // sampling.prompt_logprobs: from the first chunk
  std::vector<tandem::v1::TokenLogprobs> prompt_logprobs;
  int chunks_with_prompt_logprobs = 0;
  tandem::v1::Complete complete;
  int chunks = 0;
  grpc::Status status;
};

class RouterClusterTest : public TinyModelTest {
 protected:
  void SetUp() override { TinyModelTest::SetUp(); }

  // Starts the workers and the router; `store_bytes` bounds the store shard.
  void StartCluster(int64_t store_bytes = 64 << 20, router::RouterOptions options = {}) {
    block_store_ = cache_store::BlockStore::Create({.capacity_bytes = store_bytes}).value();
    store_service_ = std::make_unique<cache_store::CacheStoreService>(*block_store_, 4096);
    std::string store_address;
    store_server_ = ServeOnLoopback(store_service_.get(), &store_address);
    store_pool_ = std::make_unique<store::StorePool>(std::vector<std::string>{store_address}, "t");
    for (int i = 0; i < 2; ++i) {
      prefill_loops_.push_back(NewLoop());
      decode_loops_.push_back(NewLoop());
      prefills_.push_back(
          std::make_unique<prefill::PrefillService>(*prefill_loops_[i], *store_pool_));
      decodes_.push_back(std::make_unique<decode::DecodeService>(*decode_loops_[i], *store_pool_));
      std::string p, d;
      prefill_servers_.push_back(ServeOnLoopback(prefills_[i].get(), &p));
      decode_servers_.push_back(ServeOnLoopback(decodes_[i].get(), &d));
      prefill_addresses_.push_back(p);
      decode_addresses_.push_back(d);
    }
    options.model_name = "tiny";
    options.architecture = "LlamaForCausalLM";
    options.kv_dtype = "fp32";
    // The engines' default model id and their weights' fingerprint: block hashes agree.
    options.model_id = dir_;
    options.kv_layout.set_weights_fingerprint(model::WeightsFingerprint(dir_).value());
    options.limits = {.context_length = 512, .vocab_size = 128};
    options.kv_bytes_per_block = 8192;
    router_ = std::make_unique<router::RouterService>(options, nullptr, &metrics_);
    for (const auto& a : prefill_addresses_) router_->prefill_pool().Add(a);
    for (const auto& a : decode_addresses_) router_->decode_pool().Add(a);
    router_server_ = ServeOnLoopback(router_.get(), &router_address_);
    stub_ = tandem::v1::Inference::NewStub(
        grpc::CreateChannel(router_address_, grpc::InsecureChannelCredentials()));
  }

  // An engine loop over its own copy of the model (a Model serves one engine at a time).
  std::unique_ptr<engine::EngineLoop> NewLoop() {
    pools_.push_back(std::make_unique<ThreadPool>(1));
    models_.push_back(model::Model::Load(dir_, *pools_.back()).value());
    engine::EngineOptions o;
    o.kv_dtype = DType::kF32;
    o.num_blocks = 64;
    o.model_id = dir_;
    return std::make_unique<engine::EngineLoop>(engine::Engine::Create(*models_.back(), o).value());
  }

  void TearDown() override {
    OpenPrefill();
    if (router_server_) router_server_->Shutdown(std::chrono::system_clock::now());
    for (auto& s : decode_servers_) s->Shutdown(std::chrono::system_clock::now());
    for (auto& s : prefill_servers_) s->Shutdown(std::chrono::system_clock::now());
    decode_loops_.clear();
    prefill_loops_.clear();
    decodes_.clear();
    prefills_.clear();
    if (store_server_) store_server_->Shutdown(std::chrono::system_clock::now());
  }

  static std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 11 + 5) % 128);
    return p;
  }

  static tandem::v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_tokens) {
    tandem::v1::GenerateRequest r;
    for (int32_t t : prompt) r.add_prompt_token_ids(t);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }

  std::vector<int32_t> Expected(const std::vector<int32_t>& prompt, int max_tokens) {
    auto e = MakeEngine();
    return RunToCompletion(*e, GreedyRequest("x", prompt, max_tokens)).tokens;
  }

  // Reads the whole stream; `on_chunk(n)` runs after the n-th chunk (1-based).
  Result Generate(const tandem::v1::GenerateRequest& request,
                  const std::function<void(int, grpc::ClientContext&)>& on_chunk = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return Read(context, request, on_chunk);
  }

  // Generate with the caller's context (its deadline, a cancel from another thread).
  Result Read(grpc::ClientContext& context, const tandem::v1::GenerateRequest& request,
              const std::function<void(int, grpc::ClientContext&)>& on_chunk = nullptr) {
    auto reader = stub_->Generate(&context, request);
    Result r;
    tandem::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_chunk()) {
        r.tokens.insert(r.tokens.end(), msg.chunk().token_ids().begin(),
                        msg.chunk().token_ids().end());
        r.logprobs.insert(r.logprobs.end(), msg.chunk().logprobs().begin(),
                          msg.chunk().logprobs().end());
        if (msg.chunk().prompt_token_ids_size() > 0) {
          ++r.chunks_with_prompt_logprobs;
          r.prompt_token_ids.assign(msg.chunk().prompt_token_ids().begin(),
                                    msg.chunk().prompt_token_ids().end());
          r.prompt_logprobs.assign(msg.chunk().prompt_logprobs().begin(),
                                   msg.chunk().prompt_logprobs().end());
        }
        if (on_chunk) on_chunk(++r.chunks, context);
      } else {
        r.complete = msg.complete();
      }
    }
    r.status = reader->Finish();
    return r;
  }

  // Holds every prefill engine loop (requests reach the workers and wait there) until
  // OpenPrefill; TearDown opens it too.
  void GatePrefill() {
    gate_ = std::make_shared<absl::Notification>();
    for (auto& loop : prefill_loops_) {
      loop->Post([gate = gate_](engine::Engine&) { gate->WaitForNotification(); });
    }
  }
  void OpenPrefill() {
    if (gate_ != nullptr && !gate_->HasBeenNotified()) gate_->Notify();
  }

  bool AllBlocksFree() {
    for (auto& l : decode_loops_) {
      if (UsedBlocks(*l) != 0) return false;
    }
    for (auto& l : prefill_loops_) {
      if (UsedBlocks(*l) != 0) return false;
    }
    const router::RouterService::Load load = router_->GetLoad();
    return load.waiting == 0 && load.running == 0;
  }

  std::shared_ptr<absl::Notification> gate_;
  metrics::Metrics metrics_;
  std::vector<std::unique_ptr<ThreadPool>> pools_;
  std::vector<std::unique_ptr<model::Model>> models_;
  std::unique_ptr<cache_store::BlockStore> block_store_;
  std::unique_ptr<cache_store::CacheStoreService> store_service_;
  std::unique_ptr<grpc::Server> store_server_;
  std::unique_ptr<store::StorePool> store_pool_;
  std::vector<std::unique_ptr<engine::EngineLoop>> prefill_loops_, decode_loops_;
  std::vector<std::unique_ptr<prefill::PrefillService>> prefills_;
  std::vector<std::unique_ptr<decode::DecodeService>> decodes_;
  std::vector<std::unique_ptr<grpc::Server>> prefill_servers_, decode_servers_;
  std::vector<std::string> prefill_addresses_, decode_addresses_;
  std::unique_ptr<router::RouterService> router_;
  std::unique_ptr<grpc::Server> router_server_;
  std::string router_address_;
  std::unique_ptr<tandem::v1::Inference::Stub> stub_;
};

}  // namespace tandem::testing
