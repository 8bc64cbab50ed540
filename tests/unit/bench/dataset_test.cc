#include "bench/serving/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

namespace tandem::bench {
namespace {

using ::testing::HasSubstr;

TEST(LoadgenJsonlDatasetTest, ParsesLinesSkippingBlankOnesAndCarriageReturns) {
  auto requests = ParseJsonlDataset(
      "{\"prompt\": \"Hello\", \"max_tokens\": 4}\r\n"
      "\n"
      "   \n"
      "{\"max_tokens\": 16, \"prompt\": \"def quicksort(arr):\"}\n",
      "data.jsonl");
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].prompt, "Hello");
  EXPECT_EQ((*requests)[0].max_tokens, 4);
  EXPECT_TRUE((*requests)[0].prompt_token_ids.empty());
  EXPECT_EQ((*requests)[1].prompt, "def quicksort(arr):");
  EXPECT_EQ((*requests)[1].max_tokens, 16);
}

// Each bad line is reported with the file name and its 1-based line number.
TEST(LoadgenJsonlDatasetTest, BadLinesNameTheLineAndTheProblem) {
  const std::string good = "{\"prompt\": \"a\", \"max_tokens\": 1}\n";
  struct Case {
    std::string line;
    std::string expected;
  };
  const Case cases[] = {
      {"{\"prompt\": \"a\", \"max_tokens\": 1", "d.jsonl:3: not valid JSON"},
      {"[1, 2]", "d.jsonl:3: top-level JSON value must be an object"},
      {"{\"max_tokens\": 5}", "d.jsonl:3: give exactly one of \"prompt\" and \"input_length\""},
      {"{\"prompt\": \"\", \"max_tokens\": 5}", "d.jsonl:3: key \"prompt\" is empty"},
      {"{\"prompt\": 7, \"max_tokens\": 5}", "d.jsonl:3: key \"prompt\" must be a string"},
      {"{\"prompt\": \"a\"}",
       "d.jsonl:3: give exactly one of \"max_tokens\" and \"output_length\""},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}", "d.jsonl:3: key \"max_tokens\" is 0, outside"},
      {"{\"prompt\": \"a\", \"max_tokens\": 2.5}", "\"max_tokens\" must be an integer"},
      {"{\"prompt\": \"a\", \"max_token\": 5}", "d.jsonl:3: unknown key \"max_token\""},
  };
  for (const Case& c : cases) {
    auto result = ParseJsonlDataset(good + "\n" + c.line + "\n" + good, "d.jsonl");
    ASSERT_FALSE(result.ok()) << c.line;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr(c.expected)) << c.line;
  }
}

// Mooncake's trace lines: lengths, block ids and send times in milliseconds.
TEST(LoadgenJsonlDatasetTest, ParsesTraceLines) {
  auto requests = ParseJsonlDataset(
      "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [4, 9]}\n"
      "{\"timestamp\": 1500.5, \"input_length\": 3, \"max_tokens\": 2}\n",
      "trace.jsonl");
  ASSERT_TRUE(requests.ok()) << requests.status();
  ASSERT_EQ(requests->size(), 2u);
  EXPECT_EQ((*requests)[0].input_length, 700);
  EXPECT_EQ((*requests)[0].max_tokens, 5);
  EXPECT_EQ((*requests)[0].hash_ids, (std::vector<uint64_t>{4, 9}));
  EXPECT_EQ((*requests)[0].timestamp_s, 0);
  EXPECT_DOUBLE_EQ((*requests)[1].timestamp_s, 1.5005);
  EXPECT_TRUE(HasTimestamps(*requests));
  EXPECT_EQ(PromptLengths(*requests), (std::vector<int32_t>{700, 3}));
  auto text = ParseJsonlDataset("{\"prompt\": \"a\", \"max_tokens\": 1}", "t");
  ASSERT_TRUE(text.ok());
  EXPECT_FALSE(HasTimestamps(*text));
  EXPECT_FALSE(PromptLengths(*text).has_value());  // text: the tokenizer's to count
}

TEST(LoadgenJsonlDatasetTest, BadTraceLinesAreClearErrors) {
  struct Case {
    std::string text, expected;
  };
  const std::string ok = "{\"timestamp\": 5, \"input_length\": 3, \"output_length\": 1}\n";
  const Case cases[] = {
      {"{\"prompt\": \"a\", \"input_length\": 3, \"max_tokens\": 1}",
       "t:1: give exactly one of \"prompt\" and \"input_length\""},
      {"{\"input_length\": 3, \"max_tokens\": 1, \"output_length\": 1}",
       "exactly one of \"max_tokens\" and \"output_length\""},
      {"{\"input_length\": 0, \"max_tokens\": 1}", "\"input_length\" is 0, outside"},
      {"{\"input_length\": 3, \"max_tokens\": 1, \"hash_ids\": 7}",
       "\"hash_ids\" must be an array"},
      {"{\"input_length\": 3, \"max_tokens\": 1, \"hash_ids\": [-1]}", "non-negative integers"},
      {"{\"prompt\": \"a\", \"max_tokens\": 1, \"hash_ids\": [1]}", "needs input_length"},
      {"{\"input_length\": 3, \"max_tokens\": 1, \"timestamp\": -4}", "\"timestamp\" is -4"},
      {ok + "{\"input_length\": 3, \"max_tokens\": 1}", "t:2: \"timestamp\" must be on every line"},
      {"{\"input_length\": 3, \"max_tokens\": 1}\n" + ok, "t:2: \"timestamp\" must be on every"},
      {ok + "{\"timestamp\": 4, \"input_length\": 3, \"max_tokens\": 1}",
       "t:2: \"timestamp\" goes back"},
  };
  for (const Case& c : cases) {
    auto result = ParseJsonlDataset(c.text, "t");
    ASSERT_FALSE(result.ok()) << c.text;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(), HasSubstr(c.expected)) << c.text;
  }
}

// A hash id's block is the same ids wherever it appears: lines sharing leading ids share that
// prefix and nothing more; the rest of a prompt is its own. Deterministic for a seed.
TEST(LoadgenJsonlDatasetTest, SynthesizedPromptsShareExactlyTheirSharedBlocks) {
  std::vector<BenchRequest> r(3);
  r[0] = {.input_length = 1100, .hash_ids = {1, 2, 3}};
  r[1] = {.input_length = 1300, .hash_ids = {1, 2, 5}};
  r[2] = {.input_length = 700};  // no ids: all its own
  std::vector<BenchRequest> again = r;
  SynthesizePrompts(r, 50, 7);
  SynthesizePrompts(again, 50, 7);
  for (size_t i = 0; i < r.size(); ++i) {
    ASSERT_EQ(std::ssize(r[i].prompt_token_ids), r[i].input_length);
    EXPECT_EQ(r[i].prompt_token_ids, again[i].prompt_token_ids);
    for (int32_t id : r[i].prompt_token_ids) ASSERT_TRUE(id >= 0 && id < 50);
  }
  auto common = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
  };
  // Two blocks shared; the third differs within a few tokens (ids drawn from 50).
  EXPECT_GE(common(r[0].prompt_token_ids, r[1].prompt_token_ids), 2u * kTraceBlockTokens);
  EXPECT_LT(common(r[0].prompt_token_ids, r[1].prompt_token_ids), 2u * kTraceBlockTokens + 8);
  EXPECT_LT(common(r[0].prompt_token_ids, r[2].prompt_token_ids), 8u);
  std::vector<BenchRequest> other = again;
  for (auto& o : other) o.prompt_token_ids.clear();
  SynthesizePrompts(other, 50, 8);
  EXPECT_NE(other[0].prompt_token_ids, r[0].prompt_token_ids);
}

TEST(LoadgenJsonlDatasetTest, EmptyInputIsAnError) {
  auto result = ParseJsonlDataset("\n\n", "empty.jsonl");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("empty.jsonl: no requests"));
}

TEST(LoadgenJsonlDatasetTest, LoadsFromAFileAndReportsAMissingOne) {
  const std::string path = ::testing::TempDir() + "/dataset_test.jsonl";
  std::ofstream(path) << "{\"prompt\": \"x\", \"max_tokens\": 3}\n";
  auto loaded = LoadJsonlDataset(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->size(), 1u);
  auto missing = LoadJsonlDataset(path + ".missing");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(".missing"));
}

TEST(LoadgenTakeRequestsTest, WrapsAroundAShortDataset) {
  std::vector<BenchRequest> data(3);
  for (int i = 0; i < 3; ++i) data[i].max_tokens = i + 1;
  std::vector<BenchRequest> taken = TakeRequests(data, 7);
  ASSERT_EQ(taken.size(), 7u);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(taken[i].max_tokens, i % 3 + 1);
  EXPECT_EQ(TakeRequests(data, 2).size(), 2u);
}

TEST(LoadgenRandomDatasetTest, FixedLengthsWithZeroRangeAndIdsBelowTheVocabulary) {
  auto requests = MakeRandomDataset(
      {.num_requests = 50, .input_len = 64, .output_len = 8, .vocab_size = 100, .seed = 3});
  ASSERT_EQ(requests.size(), 50u);
  std::vector<bool> seen(100, false);
  for (const BenchRequest& r : requests) {
    EXPECT_TRUE(r.prompt.empty());
    ASSERT_EQ(r.prompt_token_ids.size(), 64u);
    EXPECT_EQ(r.max_tokens, 8);
    for (int32_t id : r.prompt_token_ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 100);
      seen[id] = true;
    }
  }
  // 3200 uniform draws over 100 ids leave none unseen (chance ~ 100 * e^-32).
  EXPECT_EQ(std::count(seen.begin(), seen.end(), false), 0);
}

TEST(LoadgenRandomDatasetTest, LengthsAreUniformOverTheRangeAndDeterministic) {
  RandomDatasetOptions o{.num_requests = 4000,
                         .input_len = 100,
                         .input_len_range = 0.5,
                         .output_len = 20,
                         .output_len_range = 0.25,
                         .vocab_size = 10,
                         .seed = 11};
  auto requests = MakeRandomDataset(o);
  double input_sum = 0;
  int input_min = 1 << 30, input_max = 0, output_min = 1 << 30, output_max = 0;
  for (const BenchRequest& r : requests) {
    const int len = static_cast<int>(r.prompt_token_ids.size());
    input_sum += len;
    input_min = std::min(input_min, len);
    input_max = std::max(input_max, len);
    output_min = std::min(output_min, r.max_tokens);
    output_max = std::max(output_max, r.max_tokens);
  }
  EXPECT_EQ(input_min, 50);
  EXPECT_EQ(input_max, 150);
  EXPECT_EQ(output_min, 15);
  EXPECT_EQ(output_max, 25);
  // Uniform on [50, 150]: mean 100, standard error 29/sqrt(4000) = 0.46.
  EXPECT_NEAR(input_sum / requests.size(), 100, 2.5);
  EXPECT_EQ(MaxRandomLength(100, 0.5), 150);

  auto again = MakeRandomDataset(o);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(again[i].prompt_token_ids, requests[i].prompt_token_ids);
    ASSERT_EQ(again[i].max_tokens, requests[i].max_tokens);
  }
}

}  // namespace
}  // namespace tandem::bench
