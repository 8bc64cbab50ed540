#include "common/tokenizer/added_tokens.h"

namespace tandem::tokenizer {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool IsWordByte(char c) {
  auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         c == '_';
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  terminal_.push_back(-1);
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& s = tokens_[t].content;
    if (s.empty()) continue;
    first_bytes_.set(static_cast<unsigned char>(s[0]));
    int32_t node = 0;
    for (char c : s) {
      uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
      auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    // A later duplicate of the same content keeps the first entry, like a vocabulary would.
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(t);
  }
}

AddedTokenMatcher::Match AddedTokenMatcher::LongestAt(std::string_view text, size_t pos) const {
  Match best;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]);
    auto it = edges_.find(key);
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {i + 1 - pos, terminal_[node]};
  }
  return best;
}

bool AddedTokenMatcher::WordBoundaryOk(std::string_view text, size_t begin, size_t end) const {
  bool before = begin > 0 && IsWordByte(text[begin - 1]);
  bool after = end < text.size() && IsWordByte(text[end]);
  return !before && !after;
}

std::vector<TextSegment> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<TextSegment> segs;
  std::vector<int> token_of_seg;  // Index into tokens_ for token segments, else -1.
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!first_bytes_.test(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    Match m = LongestAt(text, i);
    if (m.token < 0 || (tokens_[m.token].single_word && !WordBoundaryOk(text, i, i + m.length))) {
      ++i;
      continue;
    }
    if (i > start) {
      segs.push_back({text.substr(start, i - start), -1});
      token_of_seg.push_back(-1);
    }
    segs.push_back({text.substr(i, m.length), tokens_[m.token].id});
    token_of_seg.push_back(m.token);
    i += m.length;
    start = i;
  }
  if (start < text.size()) {
    segs.push_back({text.substr(start), -1});
    token_of_seg.push_back(-1);
  }
  for (size_t s = 0; s < segs.size(); ++s) {
    if (token_of_seg[s] < 0) continue;
    const AddedToken& t = tokens_[token_of_seg[s]];
    if (t.lstrip && s > 0 && segs[s - 1].id < 0) {
      std::string_view& prev = segs[s - 1].text;
      while (!prev.empty() && IsSpace(prev.back())) prev.remove_suffix(1);
    }
    if (t.rstrip && s + 1 < segs.size() && segs[s + 1].id < 0) {
      std::string_view& next = segs[s + 1].text;
      while (!next.empty() && IsSpace(next.front())) next.remove_prefix(1);
    }
  }
  return segs;
}

}  // namespace tandem::tokenizer
