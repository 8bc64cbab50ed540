// model-inspect quantize: a float model written as a GPTQ, AWQ or compressed-tensors checkpoint.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/model/quantized_writer.h"
#include "common/util/status_macros.h"
#include "tools/model_inspect/commands.h"

namespace tandem::tools {

absl::Status RunQuantize(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"model", "out", "format", "bits", "group-size", "sym",
                                          "activations", "lm-head", "threads"}));
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  TANDEM_ASSIGN_OR_RETURN(std::string out, args.String("out"));
  model::CheckpointQuantization q;
  TANDEM_RETURN_IF_ERROR(model::ParseCheckpointFormat(args.StringOr("format", "gptq"), q.format));
  const bool awq = q.format == model::CheckpointQuantization::Format::kAwq;
  TANDEM_ASSIGN_OR_RETURN(int64_t bits, args.IntOr("bits", 4));
  TANDEM_ASSIGN_OR_RETURN(int64_t group, args.IntOr("group-size", 128));
  if (bits < 1 || bits > 8 || group < -1 || group > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--bits ", bits, " / --group-size ", group, " out of range"));
  }
  q.bits = static_cast<int>(bits);
  q.group_size = static_cast<int>(group);
  const std::string sym = args.StringOr("sym", awq ? "false" : "true");
  if (sym != "true" && sym != "false") {
    return absl::InvalidArgumentError(absl::StrCat("--sym must be true or false, got ", sym));
  }
  q.symmetric = sym == "true";
  const std::string activations = args.StringOr("activations", "float");
  if (activations != "float" && activations != "int8") {
    return absl::InvalidArgumentError(
        absl::StrCat("--activations must be float or int8, got ", activations));
  }
  q.int8_activations = activations == "int8";
  const std::string lm_head = args.StringOr("lm-head", "false");
  if (lm_head != "true" && lm_head != "false") {
    return absl::InvalidArgumentError(
        absl::StrCat("--lm-head must be true or false, got ", lm_head));
  }
  q.lm_head = lm_head == "true";
  TANDEM_ASSIGN_OR_RETURN(auto pool, MakePool(args));
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(model::WriteQuantizedCheckpoint(dir, out, q, *pool));
  std::fprintf(stderr, "quantized %s into %s in %.1f s\n", dir.c_str(), out.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

}  // namespace tandem::tools
