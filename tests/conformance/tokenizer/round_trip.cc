// Conformance helper: for each line of a text file checks decode(encode(line)) == line and
// that streaming the ids through IncrementalDetokenizer yields the same text.
// usage: tokenizer_round_trip MODEL_DIR TEXT_FILE
// Lines a normalizer changes (e.g. NFC on decomposed accents) are compared with their NFC
// form and counted separately. Exit status 1 on any mismatch.
#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"

namespace {

using tandem::tokenizer::IncrementalDetokenizer;
using tandem::tokenizer::Tokenizer;

std::string Nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  if (out == nullptr) return s;
  std::string r(reinterpret_cast<char*>(out));
  std::free(out);
  return r;
}

// Decoded text of `ids` delivered one id at a time.
std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  IncrementalDetokenizer detok(tok, /*skip_special_tokens=*/false);
  std::string text;
  for (int32_t id : ids) text += detok.Add(id).value_or("<error>");
  return text + detok.Flush();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE\n", argv[0]);
    return 2;
  }
  auto tok = Tokenizer::Load(argv[1]);
  auto text = tandem::ReadFileToString(argv[2]);
  if (!tok.ok() || !text.ok()) {
    std::fprintf(stderr, "%s\n", (!tok.ok() ? tok.status() : text.status()).ToString().c_str());
    return 2;
  }
  int exact = 0, after_nfc = 0, bad = 0, stream_bad = 0, lines = 0;
  size_t start = 0;
  while (start < text->size()) {
    size_t end = text->find('\n', start);
    if (end == std::string::npos) end = text->size();
    std::string line = text->substr(start, end - start);
    start = end + 1;
    ++lines;
    auto ids = (*tok)->Encode(line, false);
    auto decoded = ids.ok() ? (*tok)->Decode(*ids, false) : ids.status();
    if (!decoded.ok()) {
      std::printf("  line %d: %s\n", lines, decoded.status().ToString().c_str());
      ++bad;
      continue;
    }
    if (*decoded == line) {
      ++exact;
    } else if (*decoded == Nfc(line)) {
      ++after_nfc;
    } else {
      ++bad;
      std::printf("  line %d: round trip differs:\n    in:  [%s]\n    out: [%s]\n", lines,
                  line.c_str(), decoded->c_str());
    }
    if (Stream(**tok, *ids) != *decoded) {
      ++stream_bad;
      std::printf("  line %d: streaming decode differs from Decode\n", lines);
    }
  }
  std::printf(
      "round trip: %d lines, %d exact, %d equal to the NFC form, %d mismatches; "
      "streaming mismatches: %d\n",
      lines, exact, after_nfc, bad, stream_bad);
  return bad == 0 && stream_bad == 0 ? 0 : 1;
}
