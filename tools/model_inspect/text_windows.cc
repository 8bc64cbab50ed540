#include "tools/model_inspect/text_windows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tandem::tools {

absl::StatusOr<WindowFlags> ParseWindowFlags(const CliArgs& args, int64_t prompt_tokens,
                                             int64_t continuation_tokens) {
  WindowFlags f;
  TANDEM_ASSIGN_OR_RETURN(f.prompt_tokens, args.IntOr("prompt-tokens", prompt_tokens));
  TANDEM_ASSIGN_OR_RETURN(f.continuation_tokens,
                          args.IntOr("continuation-tokens", continuation_tokens));
  TANDEM_ASSIGN_OR_RETURN(f.windows, args.IntOr("windows", 8));
  if (f.prompt_tokens < 2 || f.prompt_tokens > kMaxWindowTokens || f.continuation_tokens < 1 ||
      f.continuation_tokens > kMaxWindowTokens || f.windows < 1 || f.windows > kMaxWindowTokens) {
    return absl::InvalidArgumentError(
        "--prompt-tokens must be >= 2, --continuation-tokens and --windows >= 1");
  }
  return f;
}

absl::StatusOr<std::vector<Window>> CutWindows(const tokenizer::Tokenizer& tok,
                                               const std::string& text, int prompt_tokens,
                                               int continuation_tokens, int max_windows) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(text, /*add_special=*/false));
  const int bos = tok.bos_id() >= 0 ? 1 : 0;
  const size_t stride = static_cast<size_t>(prompt_tokens - bos + continuation_tokens);
  std::vector<Window> windows;
  for (size_t start = 0;
       start + stride <= ids.size() && static_cast<int>(windows.size()) < max_windows;
       start += stride) {
    Window w;
    if (bos) w.prompt.push_back(tok.bos_id());
    const auto mid = ids.begin() + start + (prompt_tokens - bos);
    w.prompt.insert(w.prompt.end(), ids.begin() + start, mid);
    w.continuation.assign(mid, mid + continuation_tokens);
    TANDEM_ASSIGN_OR_RETURN(std::string bytes,
                            tok.DecodeBytes(w.continuation, /*skip_special_tokens=*/false));
    w.continuation_bytes = static_cast<int64_t>(bytes.size());
    windows.push_back(std::move(w));
  }
  if (windows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text has ", ids.size(), " tokens, fewer than one window of ", stride));
  }
  return windows;
}

int32_t Argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

}  // namespace tandem::tools
