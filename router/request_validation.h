// Checks of a public GenerateRequest before any work starts (DESIGN.md, "Public API"): every
// error is INVALID_ARGUMENT with a message naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "tandem/v1/inference.pb.h"

namespace tandem::router {

struct ModelLimits {
  int64_t context_length = 0;
  int32_t vocab_size = 0;
  // The operator's limits on a request (router.max_*), each refused naming the field and the
  // limit. 0: the context length.
  int64_t max_prompt_tokens = 0;
  int64_t max_tokens = 0;
  int max_stop_strings = 16;
  int max_stop_bytes = 256;
  int max_logprobs = 20;  // sampling.top_logprobs
};

// A Generate request off the wire (see inference_wire.proto): InvalidArgument when it does not
// parse or a text field is not valid UTF-8.
absl::StatusOr<tandem::v1::GenerateRequest> ParseGenerateRequest(const grpc::ByteBuffer& bytes);

// InvalidArgument with `message`, naming `field` (the request field's path, such as
// "sampling.max_tokens") in a payload, so a front door can name it in its own terms.
absl::Status InvalidField(const std::string& field, const std::string& message);
// `status` naming `field`.
absl::Status WithField(absl::Status status, const std::string& field);
// The field an InvalidField (or WithField) error names; empty for other errors.
std::string FieldOf(const absl::Status& status);

// The sampling fields alone, against `limits`' max_tokens (when set), stop and logprobs limits.
absl::Status ValidateSampling(const tandem::v1::SamplingParams& sampling,
                              const ModelLimits& limits = {});

// The prompt as token ids (text is tokenized with BOS as the model's tokenizer config says),
// checked against the vocabulary and, with max_tokens, against the context length.
// `tokenizer` may be null: text prompts are then refused.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const tandem::v1::GenerateRequest& request,
                                                  const tokenizer::Tokenizer* tokenizer,
                                                  const ModelLimits& limits);

}  // namespace tandem::router
