#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace tandem::tokenizer::testing {

// Tiny hand-written tokenizer.json documents, one per family, for unit tests.

// Byte-level (GPT-2 / Llama 3 style): all 256 byte characters (ids 0..255, in byte order),
// merges making "Ġthe", "hello", "ĠĠ" etc., a Split regex + ByteLevel pre-tokenizer, and
// added tokens "<|bos|>" (special, 300) and "<tool>" (not special, 301, rstrip).
nlohmann::json ByteLevelJson();

// SentencePiece style (Llama 2 style): Prepend + Replace normalizer, byte_fallback <0xNN>
// tokens, <unk>=0, <s>=1, </s>=2 and a TemplateProcessing BOS.
nlohmann::json SentencePieceJson();

// Id of `token` in the document's model vocab (or added tokens), -1 if absent.
int Id(const nlohmann::json& doc, const std::string& token);

}  // namespace tandem::tokenizer::testing
