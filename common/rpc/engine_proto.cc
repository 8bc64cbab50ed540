#include "common/rpc/engine_proto.h"

#include <string>

namespace tandem::rpc {

model::SamplingParams ToSamplingParams(const tandem::v1::SamplingParams& sampling) {
  model::SamplingParams p;
  p.temperature = sampling.temperature();
  p.top_p = sampling.top_p();
  p.top_k = sampling.top_k();
  p.seed = sampling.seed();
  p.seeded = sampling.seeded();
  p.presence_penalty = sampling.presence_penalty();
  p.frequency_penalty = sampling.frequency_penalty();
  p.repetition_penalty = sampling.repetition_penalty() == 0 ? 1.0f : sampling.repetition_penalty();
  p.logprobs = sampling.logprobs() ? sampling.top_logprobs() : -1;
  return p;
}

int PromptLogprobs(const tandem::v1::SamplingParams& sampling, int completion_tokens) {
  return sampling.prompt_logprobs() && completion_tokens == 0 ? sampling.top_logprobs() : -1;
}

const char* FinishReasonName(tandem::v1::FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "unspecified";
  }
}

void ToProto(const model::TokenLogprobs& logprobs, tandem::v1::TokenLogprobs* out) {
  out->set_logprob(logprobs.logprob);
  for (const auto& [token, logprob] : logprobs.top) {
    out->add_top_token_ids(token);
    out->add_top_logprobs(logprob);
  }
}

tandem::v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return tandem::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kAbort:
      return tandem::v1::FINISH_REASON_ABORT;
    default:
      return tandem::v1::FINISH_REASON_UNSPECIFIED;
  }
}

tandem::v1::KvLayout ToProto(const kv::KvLayout& layout, bool mixed) {
  tandem::v1::KvLayout out;
  out.set_num_layers(layout.num_layers);
  out.set_num_kv_heads(layout.num_kv_heads);
  out.set_head_dim(layout.head_dim);
  out.set_block_size(layout.block_size);
  out.set_dtype(mixed ? "mixed" : std::string(DTypeName(layout.dtype)));
  return out;
}

}  // namespace tandem::rpc
