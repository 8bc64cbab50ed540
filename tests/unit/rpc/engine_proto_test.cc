// The engine <-> worker-protocol conversions the worker roles share.
#include "common/rpc/engine_proto.h"

#include <gtest/gtest.h>

namespace tandem::rpc {
namespace {

TEST(EngineProtoTest, SamplingFieldsCarryOver) {
  tandem::v1::SamplingParams s;
  s.set_temperature(0.7f);
  s.set_top_p(0.9f);
  s.set_top_k(40);
  s.set_seed(1234);
  const model::SamplingParams p = ToSamplingParams(s);
  EXPECT_FLOAT_EQ(p.temperature, 0.7f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_EQ(p.seed, 1234u);
  EXPECT_TRUE(p.Validate().ok());
}

TEST(EngineProtoTest, FinishReasonsMapOneToOne) {
  EXPECT_EQ(ToProto(engine::FinishReason::kStop), tandem::v1::FINISH_REASON_STOP);
  EXPECT_EQ(ToProto(engine::FinishReason::kLength), tandem::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ToProto(engine::FinishReason::kAbort), tandem::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(ToProto(engine::FinishReason::kNone), tandem::v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(ToProto(engine::FinishReason::kError), tandem::v1::FINISH_REASON_UNSPECIFIED);
}

TEST(EngineProtoTest, KvLayoutNamesItsDtypeOrMixed) {
  kv::KvLayout layout;
  layout.num_layers = 8;
  layout.num_kv_heads = 2;
  layout.head_dim = 32;
  layout.block_size = 16;
  layout.dtype = DType::kBF16;
  const tandem::v1::KvLayout plain = ToProto(layout);
  EXPECT_EQ(plain.num_layers(), 8);
  EXPECT_EQ(plain.num_kv_heads(), 2);
  EXPECT_EQ(plain.head_dim(), 32);
  EXPECT_EQ(plain.block_size(), 16);
  EXPECT_EQ(plain.dtype(), "bf16");
  EXPECT_EQ(ToProto(layout, /*mixed=*/true).dtype(), "mixed");
}

}  // namespace
}  // namespace tandem::rpc
