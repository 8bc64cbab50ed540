// model-inspect tokenize / detokenize, and the prompt handling of generate.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"
#include "common/util/status_macros.h"
#include "tools/model_inspect/commands.h"

namespace tandem::tools {
namespace {

absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> LoadTokenizer(const CliArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(std::string dir, args.String("model"));
  return tokenizer::Tokenizer::Load(dir);
}

}  // namespace

absl::Status RunTokenize(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"model", "text-file"}));
  TANDEM_ASSIGN_OR_RETURN(std::string path, args.String("text-file"));
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  TANDEM_ASSIGN_OR_RETURN(auto tok, LoadTokenizer(args));
  std::string out;
  size_t start = 0;
  int line_number = 1;
  // One output line per input line; a final newline does not start another line.
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    auto ids = tok->Encode(std::string_view(text).substr(start, end - start),
                           /*add_special_tokens=*/false);
    if (!ids.ok()) {
      return absl::Status(ids.status().code(),
                          absl::StrCat(path, ":", line_number, ": ", ids.status().message()));
    }
    absl::StrAppend(&out, absl::StrJoin(*ids, ","), "\n");
    start = end + 1;
    ++line_number;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return absl::OkStatus();
}

absl::Status RunDetokenize(const CliArgs& args) {
  TANDEM_RETURN_IF_ERROR(args.CheckKnown({"model", "ids", "skip-special-tokens"}));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, args.IntList("ids"));
  TANDEM_ASSIGN_OR_RETURN(auto tok, LoadTokenizer(args));
  TANDEM_ASSIGN_OR_RETURN(std::string text, tok->Decode(ids, args.Has("skip-special-tokens")));
  std::printf("%s\n", text.c_str());
  return absl::OkStatus();
}

absl::StatusOr<PromptTokens> ResolvePrompt(const CliArgs& args) {
  PromptTokens prompt;
  if (!args.Has("prompt")) {
    TANDEM_ASSIGN_OR_RETURN(prompt.ids, args.IntList("tokens"));
    return prompt;
  }
  if (args.Has("tokens")) return absl::InvalidArgumentError("give --prompt or --tokens, not both");
  TANDEM_ASSIGN_OR_RETURN(std::string text, args.String("prompt"));
  TANDEM_ASSIGN_OR_RETURN(prompt.tokenizer, LoadTokenizer(args));
  TANDEM_ASSIGN_OR_RETURN(prompt.ids, prompt.tokenizer->Encode(text, /*add_special_tokens=*/true));
  if (prompt.ids.empty()) return absl::InvalidArgumentError("--prompt encodes to no tokens");
  return prompt;
}

absl::Status PrintGenerated(const std::vector<int32_t>& ids, const PromptTokens& prompt) {
  std::printf("%s\n", absl::StrJoin(ids, ",").c_str());
  if (prompt.tokenizer != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(std::string text,
                            prompt.tokenizer->Decode(ids, /*skip_special_tokens=*/true));
    std::printf("%s\n", text.c_str());
  }
  return absl::OkStatus();
}

}  // namespace tandem::tools
