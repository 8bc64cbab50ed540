// libFuzzer target: the router's parse of a Generate request off the wire, its validation and
// tokenization, and the output path fed with the request's own ids and stop strings. Accepted
// requests must re-serialize to bytes that parse to the same request, and every text delta the
// client would see must be valid UTF-8.
#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "common/util/utf8.h"
#include "router/output_assembler.h"
#include "router/request_validation.h"

namespace {

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

const tandem::tokenizer::Tokenizer* BundledTokenizer() {
  static const auto* tokenizer =
      tandem::tokenizer::Tokenizer::Load(TANDEM_SOURCE_DIR "/models/tandem-py-8l").value().release();
  return tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto request = tandem::router::ParseGenerateRequest(Bytes(bytes));
  if (!request.ok()) return 0;
  auto again = tandem::router::ParseGenerateRequest(Bytes(request->SerializeAsString()));
  if (!again.ok() || again->SerializeAsString() != request->SerializeAsString()) std::abort();
  const tandem::router::ModelLimits limits{.context_length = 2048, .vocab_size = 4096};
  if (!tandem::router::ValidateSampling(request->sampling()).ok()) return 0;
  auto ids = tandem::router::PromptTokens(*request, BundledTokenizer(), limits);
  if (!ids.ok()) return 0;
  std::vector<std::string> stop(request->sampling().stop().begin(),
                                request->sampling().stop().end());
  tandem::router::OutputAssembler out(BundledTokenizer(), stop);
  std::string text;
  for (int32_t id : *ids) {
    auto delta = out.Add(std::span<const int32_t>(&id, 1));
    if (!delta.ok()) std::abort();  // ids were validated against the vocabulary
    text += delta->text;
    if (delta->stopped) break;
  }
  text += out.Flush();
  if (!tandem::ValidateUtf8(text).ok()) std::abort();
  return 0;
}
