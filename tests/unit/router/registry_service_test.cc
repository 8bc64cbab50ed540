// The router's registry over real gRPC on loopback: who may join. A worker joins only as prefill
// or decode, at a host:port, serving the router's model with the router's KV layout; anything
// else is refused with a status that names both sides.
#include "router/registry_service.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "common/rpc/registration.h"
#include "router/router_service.h"
#include "tests/unit/testing/serving.h"

namespace tandem::router {
namespace {

using tandem::v1::RegisterRequest;
using ::testing::HasSubstr;

tandem::v1::KvLayout Layout(const std::string& dtype, int block_size) {
  tandem::v1::KvLayout l;
  l.set_num_layers(8);
  l.set_num_kv_heads(2);
  l.set_head_dim(32);
  l.set_block_size(block_size);
  l.set_dtype(dtype);
  l.set_weights_fingerprint(0xfeed);
  return l;
}

class RegistryServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RouterOptions o;
    o.model_id = "tandem-py-8l";
    o.kv_layout = Layout("mixed", 16);
    router_ = std::make_unique<RouterService>(o, nullptr, nullptr);
    registry_ = std::make_unique<RegistryService>(*router_, std::chrono::seconds(1), nullptr);
    server_ = testing::ServeOnLoopback(registry_.get(), &address_);
    stub_ = tandem::v1::Registry::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  static RegisterRequest Request(tandem::v1::WorkerRole role, const std::string& address) {
    RegisterRequest r;
    r.set_role(role);
    r.set_address(address);
    r.set_model_id("tandem-py-8l");
    *r.mutable_layout() = Layout("mixed", 16);
    return r;
  }

  grpc::Status Register(const RegisterRequest& request,
                        tandem::v1::RegisterResponse* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    tandem::v1::RegisterResponse ignored;
    return stub_->Register(&context, request, response != nullptr ? response : &ignored);
  }

  // The warning the router answers `address` registering with `kernels` (KvLayout.kernels).
  std::string KernelsWarning(tandem::v1::WorkerRole role, const std::string& address,
                             const std::string& kernels) {
    RegisterRequest r = Request(role, address);
    r.mutable_layout()->set_kernels(kernels);
    tandem::v1::RegisterResponse response;
    const grpc::Status s = Register(r, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.warning();
  }

  std::unique_ptr<RouterService> router_;
  std::unique_ptr<RegistryService> registry_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<tandem::v1::Registry::Stub> stub_;
};

TEST_F(RegistryServiceTest, AWorkerOfTheRoutersModelAndKvLayoutJoinsItsPool) {
  EXPECT_TRUE(Register(Request(tandem::v1::WORKER_ROLE_PREFILL, "10.0.0.7:7100")).ok());
  EXPECT_TRUE(Register(Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8:7200")).ok());
  EXPECT_EQ(router_->prefill_pool().size(), 1);
  EXPECT_EQ(router_->decode_pool().size(), 1);
}

TEST_F(RegistryServiceTest, AnotherKvDtypeOrBlockSizeIsRefusedNamingBoth) {
  RegisterRequest fp16 = Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8:7200");
  *fp16.mutable_layout() = Layout("fp16", 16);
  const grpc::Status s = Register(fp16);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("KV cache mismatch"));
  EXPECT_THAT(s.error_message(), HasSubstr("router's workers hold mixed blocks of 16 tokens"));
  EXPECT_THAT(s.error_message(), HasSubstr("the worker holds fp16 blocks of 16 tokens"));

  RegisterRequest blocks32 = Request(tandem::v1::WORKER_ROLE_PREFILL, "10.0.0.7:7100");
  blocks32.mutable_layout()->set_block_size(32);
  EXPECT_EQ(Register(blocks32).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  RegisterRequest heads = Request(tandem::v1::WORKER_ROLE_PREFILL, "10.0.0.7:7100");
  heads.mutable_layout()->set_num_kv_heads(4);
  EXPECT_EQ(Register(heads).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(router_->prefill_pool().size() + router_->decode_pool().size(), 0);
}

// Prefill and decode must compute the same model: a worker that quantized its weights
// differently (model.weight_quantization) would hand over KV the other side cannot continue.
TEST_F(RegistryServiceTest, AnotherWeightQuantizationIsRefusedNamingBoth) {
  RegisterRequest int4 = Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8:7200");
  int4.mutable_layout()->set_weight_quantization("int4-g128");
  const grpc::Status s = Register(int4);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("weight mismatch: this router's workers compute with float weights, the "
                        "worker with int4-g128; give every role the same "
                        "model.weight_quantization"));
  EXPECT_EQ(router_->decode_pool().size(), 0);
}

// Weights replaced under the same model id compute other KV (and key it apart): a worker whose
// weight files are not the router's is refused; one that does not say (0) is not checked.
TEST_F(RegistryServiceTest, OtherWeightsUnderTheSameModelIdAreRefused) {
  RegisterRequest retrained = Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8:7200");
  retrained.mutable_layout()->set_weights_fingerprint(0xbeef);
  const grpc::Status s = Register(retrained);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("weights mismatch"));
  EXPECT_THAT(s.error_message(), HasSubstr("000000000000beef"));
  EXPECT_EQ(router_->decode_pool().size(), 0);
  RegisterRequest unknown = Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8:7200");
  unknown.mutable_layout()->set_weights_fingerprint(0);
  EXPECT_TRUE(Register(unknown).ok());
}

// Workers on other kernels (the own, oneDNN on AVX2, oneDNN on AMX) compute the same model to
// other last bits: they join, and the router tells the one that differs, naming both sides.
TEST_F(RegistryServiceTest, WorkersOnOtherKernelsJoinWithAWarningNamingBoth) {
  using tandem::v1::WORKER_ROLE_DECODE;
  using tandem::v1::WORKER_ROLE_PREFILL;
  EXPECT_EQ(KernelsWarning(WORKER_ROLE_PREFILL, "10.0.0.7:7100", "tandem"), "");
  EXPECT_EQ(KernelsWarning(WORKER_ROLE_DECODE, "10.0.0.8:7200", "tandem"), "");
  EXPECT_EQ(KernelsWarning(WORKER_ROLE_DECODE, "10.0.0.9:7200", ""), "");  // does not say
  const std::string warning =
      KernelsWarning(WORKER_ROLE_PREFILL, "10.0.0.6:7100", "onednn/avx512_core_amx");
  EXPECT_THAT(warning, HasSubstr("10.0.0.6:7100 computes with the kernels onednn/avx512_core_amx"));
  EXPECT_THAT(warning, HasSubstr("with tandem: they compute the same model to other last bits"));
  EXPECT_THAT(warning, HasSubstr("set model.cpu_gemm to the same provider on every role"));
  EXPECT_EQ(router_->prefill_pool().size(), 2);
  EXPECT_EQ(router_->decode_pool().size(), 2);
  // Re-registered on the own kernels, the worker agrees with everyone again.
  EXPECT_EQ(KernelsWarning(WORKER_ROLE_PREFILL, "10.0.0.6:7100", "tandem"), "");
  // The field has a limit, like every request field.
  RegisterRequest huge = Request(WORKER_ROLE_DECODE, "10.0.0.5:7200");
  huge.mutable_layout()->set_kernels(std::string(65, 'x'));
  const grpc::Status s = Register(huge);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("layout.kernels is 65 bytes; at most 64"));
  EXPECT_EQ(router_->decode_pool().size(), 2);
}

TEST_F(RegistryServiceTest, AnotherModelARoleThatCannotJoinOrNoPortIsRefused) {
  RegisterRequest other = Request(tandem::v1::WORKER_ROLE_PREFILL, "10.0.0.7:7100");
  other.set_model_id("llama");
  const grpc::Status s = Register(other);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("\"tandem-py-8l\""));
  EXPECT_THAT(s.error_message(), HasSubstr("\"llama\""));

  EXPECT_EQ(Register(Request(tandem::v1::WORKER_ROLE_UNSPECIFIED, "10.0.0.7:7100")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register(Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(router_->prefill_pool().size() + router_->decode_pool().size(), 0);
}

// A worker's own side (rpc::WorkerRegistration): it hears the router's decision, which the
// worker turns into its readiness.
TEST_F(RegistryServiceTest, AWorkerRegistrationHearsWhetherItWasAccepted) {
  for (const char* dtype : {"mixed", "int8"}) {
    RegisterRequest r = Request(tandem::v1::WORKER_ROLE_DECODE, "10.0.0.8:7200");
    r.mutable_layout()->set_dtype(dtype);
    absl::Notification decided;
    bool accepted = false;
    rpc::WorkerRegistration registration(
        address_, r, [](tandem::v1::WorkerLoad*, bool) {},
        [&](bool a) {
          if (decided.HasBeenNotified()) return;
          accepted = a;
          decided.Notify();
        });
    ASSERT_TRUE(decided.WaitForNotificationWithTimeout(absl::Seconds(10))) << dtype;
    EXPECT_EQ(accepted, std::string(dtype) == "mixed") << dtype;
  }
  EXPECT_EQ(router_->decode_pool().size(), 1);
}

}  // namespace
}  // namespace tandem::router
