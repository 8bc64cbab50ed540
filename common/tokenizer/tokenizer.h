#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace tandem::tokenizer {

// A Hugging Face tokenizer.json BPE tokenizer (byte-level as in GPT-2, Llama 3 and Qwen, or
// SentencePiece-style as in Llama 2, Mistral and Gemma), plus BOS/EOS from
// tokenizer_config.json.
//
// Encode: added tokens are split off first (normalized=true ones after normalizing each
// section), then each text section is pre-tokenized and merged by BPE. Decode runs the decoder
// pipeline and replaces ill-formed UTF-8 with U+FFFD.
//
// Thread safety: immutable after loading except the BPE merge cache, which has its own lock,
// so one Tokenizer may be shared by any number of threads calling Encode/Decode.
class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);
  // `config_json` may be empty (no tokenizer_config.json). `source` names the files in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view config_json,
      const std::string& source = "tokenizer.json");

  // InvalidArgument when `text` is not valid UTF-8. `add_special_tokens` adds BOS/EOS as the
  // post-processor template and tokenizer_config.json say.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;
  // InvalidArgument on ids outside the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;
  // Decode without the final UTF-8 repair: the result may end in (or contain) a partial
  // character. For streaming, see IncrementalDetokenizer.
  absl::StatusOr<std::string> DecodeBytes(absl::Span<const int32_t> ids,
                                          bool skip_special_tokens) const;

  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none.
  int32_t eos_id() const { return eos_id_; }  // -1 when the model has none.
  int32_t vocab_size() const { return vocab_size_; }
  int32_t TokenToId(std::string_view token) const;  // -1 when absent.
  std::string IdToToken(int32_t id) const;          // Empty when absent.
  bool IsSpecial(int32_t id) const;
  // Ids added around the text when add_special_tokens is set.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }
  const std::vector<int32_t>& suffix_ids() const { return suffix_ids_; }

 private:
  friend class TokenizerLoader;
  Tokenizer() = default;
  void EncodeSection(std::string_view text, bool first_section, std::vector<int32_t>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_tokens_;
  // Added tokens with normalized=false match the raw text; those with normalized=true match
  // each text section after normalization, as in Hugging Face tokenizers.
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;  // id -> index into added_tokens_.
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  std::vector<int32_t> prefix_ids_;
  std::vector<int32_t> suffix_ids_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t vocab_size_ = 0;
};

}  // namespace tandem::tokenizer
