#include "common/tokenizer/tokenizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/util/utf8.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {

void Tokenizer::EncodeSection(std::string_view text, bool first_section,
                              std::vector<int32_t>* ids) const {
  std::string normalized =
      normalizer_ != nullptr ? normalizer_->Normalize(std::string(text)) : std::string(text);
  std::vector<TextSegment> parts = normalized_matcher_->Split(normalized);
  std::vector<std::string> pieces;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].id >= 0) {
      ids->push_back(parts[i].id);
      continue;
    }
    if (parts[i].text.empty()) continue;
    pieces.assign(1, std::string(parts[i].text));
    if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(&pieces, first_section && i == 0);
    for (const std::string& piece : pieces) model_->Encode(piece, ids);
  }
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens) const {
  TANDEM_RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = prefix_ids_;
  std::vector<TextSegment> segments = raw_matcher_->Split(text);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].id >= 0) {
      ids.push_back(segments[i].id);
    } else if (!segments[i].text.empty()) {
      EncodeSection(segments[i].text, i == 0, &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

absl::StatusOr<std::string> Tokenizer::DecodeBytes(absl::Span<const int32_t> ids,
                                                   bool skip_special_tokens) const {
  // Runs of ordinary tokens go through the decoder separately and special tokens are copied
  // verbatim, as transformers' slow tokenizers do: the space a Prepend/Metaspace normalizer
  // put in front of each text section is then stripped again, so decode(encode(x)) == x
  // holds for text containing special-token strings.
  std::string out;
  std::vector<std::string> run;
  auto flush = [&] {
    if (decoder_ != nullptr) decoder_->Decode(&run);
    for (const auto& t : run) out += t;
    run.clear();
  };
  for (int32_t id : ids) {
    bool special = IsSpecial(id);
    if (skip_special_tokens && special) continue;
    std::string token = IdToToken(id);
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
    }
    if (special) {
      flush();
      out += token;
    } else {
      run.push_back(std::move(token));
    }
  }
  flush();
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  TANDEM_ASSIGN_OR_RETURN(std::string bytes, DecodeBytes(ids, skip_special_tokens));
  return ToValidUtf8(bytes);
}

int32_t Tokenizer::TokenToId(std::string_view token) const {
  auto it = added_by_content_.find(absl::string_view(token.data(), token.size()));
  if (it != added_by_content_.end()) return it->second;
  return model_->TokenToId(token);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
    return added_tokens_[it->second].content;
  }
  return model_->IdToToken(id);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_tokens_[it->second].special;
}

}  // namespace tandem::tokenizer
