// Conversions between the engine's types and the worker protocol (workers.proto, kv.proto):
// the one place prefill and decode workers (and the router's registration) translate sampling
// parameters, finish reasons and KV layouts.
#pragma once

#include "common/engine/request.h"
#include "common/kv/kv_layout.h"
#include "common/model/sampler.h"
#include "tandem/v1/inference.pb.h"
#include "tandem/v1/kv.pb.h"

namespace tandem::rpc {

// Sampling fields of the public API as the engine takes them (proto3 zero values = defaults).
model::SamplingParams ToSamplingParams(const tandem::v1::SamplingParams& sampling);
void ToProto(const model::TokenLogprobs& logprobs, tandem::v1::TokenLogprobs* out);
// engine::Request::prompt_logprobs for a request with `completion_tokens` generated so far: the
// prompt's log-probabilities are computed once, by whoever prefills the prompt first.
int PromptLogprobs(const tandem::v1::SamplingParams& sampling, int completion_tokens);
// "stop", "length", "abort", or "unspecified".
const char* FinishReasonName(tandem::v1::FinishReason reason);

// kNone and kError have no finish reason on the wire (UNSPECIFIED).
tandem::v1::FinishReason ToProto(engine::FinishReason reason);

// A KV cache's layout as workers report it; `mixed` names a mixed-precision cache ("mixed")
// rather than its wide blocks' dtype.
tandem::v1::KvLayout ToProto(const kv::KvLayout& layout, bool mixed = false);

}  // namespace tandem::rpc
