#include "common/tokenizer/bpe_model.h"

#include <random>

#include "common/util/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::tokenizer {
namespace {

using nlohmann::json;

// Textbook BPE: repeatedly merge the best-ranked adjacent pair, leftmost on ties. O(n^2), the
// independent reference for the heap implementation.
std::vector<int32_t> ReferenceBpe(const std::string& word, const json& vocab,
                                  const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> syms;
  for (size_t i = 0; i < word.size();) {
    size_t len = Utf8LeadLength(static_cast<unsigned char>(word[i]));
    syms.push_back(word.substr(i, len));
    i += len;
  }
  while (true) {
    int best = -1;
    size_t best_rank = merges.size();
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      for (size_t r = 0; r < best_rank; ++r) {
        if (merges[r].first == syms[i] && merges[r].second == syms[i + 1]) {
          best_rank = r;
          best = static_cast<int>(i);
          break;
        }
      }
    }
    if (best < 0) break;
    syms[best] += syms[best + 1];
    syms.erase(syms.begin() + best + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& s : syms) ids.push_back(vocab[s].get<int32_t>());
  return ids;
}

// Random merges over `alphabet`, then random words: the heap merge (and, when the alphabet has
// U+2581, the cutting of words before it) must agree with the textbook algorithm.
void CheckAgainstReference(const std::vector<std::string>& alphabet, uint32_t seed) {
  std::mt19937 rng(seed);
  json vocab = json::object();
  std::vector<std::string> tokens;
  for (const auto& a : alphabet) {
    vocab[a] = static_cast<int>(tokens.size());
    tokens.push_back(a);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  json merge_list = json::array();
  while (merges.size() < 60) {
    const std::string l = tokens[rng() % tokens.size()];
    const std::string r = tokens[rng() % tokens.size()];
    std::string m = l + r;
    if (vocab.contains(m) || m.size() > 12) continue;
    merges.emplace_back(l, r);
    merge_list.push_back(json::array({l, r}));
    vocab[m] = static_cast<int>(tokens.size());
    tokens.push_back(m);
  }
  auto model = BpeModel::Parse({{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}, "t");
  ASSERT_TRUE(model.ok()) << model.status();
  for (int trial = 0; trial < 300; ++trial) {
    std::string word;
    int len = 1 + static_cast<int>(rng() % 120);
    for (int i = 0; i < len; ++i) word += alphabet[rng() % alphabet.size()];
    std::vector<int32_t> got;
    (*model)->Encode(word, &got);
    // Twice: the second answer comes from the merge cache.
    std::vector<int32_t> cached;
    (*model)->Encode(word, &cached);
    ASSERT_EQ(got, ReferenceBpe(word, vocab, merges)) << word;
    ASSERT_EQ(cached, got);
  }
}

TEST(BpeModelTest, HeapMergeMatchesReferenceOnRandomWords) {
  CheckAgainstReference({"a", "b", "c", "d"}, 7);
}

TEST(BpeModelTest, MetaspaceCutsMatchReference) {
  // Some random merges join "x" + "\u2581..." and forbid a cut there; others allow it.
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    CheckAgainstReference({"a", "b", ">", "\xE2\x96\x81"}, seed);
  }
}

TEST(BpeModelTest, VocabLookups) {
  auto model = BpeModel::Parse(
      {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 5}}}, {"merges", {"a b"}}}, "t");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->TokenToId("ab"), 5);
  EXPECT_EQ((*model)->TokenToId("zz"), -1);
  EXPECT_EQ((*model)->IdToToken(5), "ab");
  EXPECT_EQ((*model)->IdToToken(3), "");  // A hole in the id space.
  EXPECT_EQ((*model)->vocab_size(), 6);
}

TEST(BpeModelTest, RejectsUnsupportedOptions) {
  json doc = {{"type", "BPE"},
              {"vocab", {{"a", 0}}},
              {"merges", json::array()},
              {"continuing_subword_prefix", "##"}};
  EXPECT_FALSE(BpeModel::Parse(doc, "t").ok());
  doc["continuing_subword_prefix"] = nullptr;
  EXPECT_TRUE(BpeModel::Parse(doc, "t").ok());
}

}  // namespace
}  // namespace tandem::tokenizer
