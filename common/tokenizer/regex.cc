#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace tandem::tokenizer {

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern,
                                                      const std::string& source) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(source, ": regex does not compile at offset ",
                                                   offset, ": ",
                                                   reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimisation only; the interpreter gives the same matches when it is missing.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::unique_ptr<Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

namespace {

// Per-thread match state: pcre2 code is shareable, match data and JIT stacks are not. The JIT
// stack may grow to 8 MiB so lookahead-heavy patterns (\s+(?!\S)) on megabyte-long runs
// still match instead of failing with a stack-limit error.
struct MatchState {
  MatchState()
      : data(pcre2_match_data_create(1, nullptr)),
        context(pcre2_match_context_create(nullptr)),
        stack(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* stack;
};

}  // namespace

std::vector<Span> Regex::FindAll(std::string_view text) const {
  auto* code = static_cast<pcre2_code*>(code_);
  thread_local MatchState state;
  std::vector<Span> spans;
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    // Input was validated once by the tokenizer, so per-match UTF checks are skipped.
    int rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, state.data,
                         state.context);
    // No match, or a resource limit: the rest of the text stays one unmatched span, so no
    // input is lost (callers keep unmatched text).
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    size_t begin = ovector[0];
    size_t end = ovector[1];
    if (end > begin) {
      spans.push_back({begin, end});
      start = end;
    } else {
      // Empty match: step over one whole UTF-8 character.
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
        ++start;
      }
    }
  }
  return spans;
}

}  // namespace tandem::tokenizer
