#include "common/tokenizer/byte_level.h"

#include "common/util/utf8.h"

namespace tandem::tokenizer {

const ByteLevelTable& ByteLevelTable::Get() {
  static const ByteLevelTable* table = new ByteLevelTable();
  return *table;
}

ByteLevelTable::ByteLevelTable() {
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    AppendUtf8(cp, &byte_to_utf8_[b]);
    char_to_byte_[cp] = static_cast<unsigned char>(b);
  }
}

void ByteLevelTable::EncodeAppend(std::string_view bytes, std::string* out) const {
  for (char c : bytes) out->append(byte_to_utf8_[static_cast<unsigned char>(c)]);
}

std::string ByteLevelTable::Decode(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    char32_t cp = DecodeUtf8(text, &pos);
    auto it = char_to_byte_.find(cp);
    if (it != char_to_byte_.end()) {
      out.push_back(static_cast<char>(it->second));
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  return out;
}

}  // namespace tandem::tokenizer
