// Tokenizer encode throughput on one core (see docs/benchmarks.md).
// usage: TANDEM_TOKENIZER_DIR=DIR tokenizer_bench [--benchmark_filter=...]
// DIR holds tokenizer.json (+ tokenizer_config.json), e.g. a model directory or one of the
// vocabularies the conformance test extracts under
// build/tests/conformance/tokenizer/work/vocab/<name>.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace {

using tandem::tokenizer::Tokenizer;

const Tokenizer* GetTokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    const char* dir = std::getenv("TANDEM_TOKENIZER_DIR");
    if (dir == nullptr) return nullptr;
    auto t = Tokenizer::Load(dir);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return nullptr;
    }
    return t->release();
  }();
  return tok;
}

constexpr size_t kTextBytes = 1 << 20;

// Deterministic English-like prose: common words, capitalised sentences, punctuation and
// numbers, so the merge cache sees a realistic mix of hits and misses.
std::string Prose() {
  static const char* kWords[] = {"the",
                                 "of",
                                 "and",
                                 "to",
                                 "in",
                                 "is",
                                 "was",
                                 "that",
                                 "for",
                                 "it",
                                 "with",
                                 "as",
                                 "his",
                                 "on",
                                 "be",
                                 "at",
                                 "by",
                                 "had",
                                 "this",
                                 "not",
                                 "but",
                                 "from",
                                 "or",
                                 "have",
                                 "an",
                                 "they",
                                 "which",
                                 "one",
                                 "you",
                                 "were",
                                 "her",
                                 "all",
                                 "she",
                                 "there",
                                 "would",
                                 "their",
                                 "we",
                                 "him",
                                 "been",
                                 "has",
                                 "when",
                                 "who",
                                 "will",
                                 "more",
                                 "no",
                                 "if",
                                 "out",
                                 "so",
                                 "said",
                                 "what",
                                 "up",
                                 "its",
                                 "about",
                                 "into",
                                 "than",
                                 "them",
                                 "can",
                                 "only",
                                 "other",
                                 "new",
                                 "some",
                                 "could",
                                 "time",
                                 "these",
                                 "two",
                                 "may",
                                 "then",
                                 "do",
                                 "first",
                                 "any",
                                 "my",
                                 "now",
                                 "such",
                                 "like",
                                 "our",
                                 "over",
                                 "man",
                                 "me",
                                 "even",
                                 "most",
                                 "made",
                                 "after",
                                 "also",
                                 "did",
                                 "many",
                                 "before",
                                 "must",
                                 "through",
                                 "years",
                                 "where",
                                 "much",
                                 "your",
                                 "way",
                                 "well",
                                 "down",
                                 "should",
                                 "because",
                                 "each",
                                 "just",
                                 "those",
                                 "people",
                                 "how",
                                 "too",
                                 "little",
                                 "state",
                                 "good",
                                 "very",
                                 "make",
                                 "world",
                                 "still",
                                 "own",
                                 "see",
                                 "men",
                                 "work",
                                 "long",
                                 "get",
                                 "here",
                                 "between",
                                 "both",
                                 "life",
                                 "being",
                                 "under",
                                 "never",
                                 "day",
                                 "same",
                                 "another",
                                 "know",
                                 "while",
                                 "last",
                                 "might",
                                 "us",
                                 "great",
                                 "old",
                                 "year",
                                 "off",
                                 "come",
                                 "since",
                                 "against",
                                 "go",
                                 "came",
                                 "right",
                                 "used",
                                 "take",
                                 "three",
                                 "government",
                                 "understanding",
                                 "extraordinary",
                                 "electricity",
                                 "philosophical",
                                 "Mississippi",
                                 "Hamburg",
                                 "thermodynamics",
                                 "questionnaire",
                                 "unbelievable"};
  std::mt19937 rng(42);
  std::string text;
  bool capital = true;
  while (text.size() < kTextBytes) {
    std::string w = kWords[rng() % std::size(kWords)];
    if (rng() % 50 == 0) w = std::to_string(rng() % 100000);
    if (capital) w[0] = static_cast<char>(std::toupper(w[0]));
    text += w;
    capital = false;
    switch (rng() % 16) {
      case 0:
        text += ". ";
        capital = true;
        break;
      case 1:
        text += ", ";
        break;
      case 2:
        text += rng() % 4 == 0 ? ".\n\n" : "; ";
        capital = true;
        break;
      default:
        text += ' ';
    }
  }
  return text;
}

// Deterministic C++/Python-flavoured source code with indentation runs.
std::string Code() {
  static const char* kLines[] = {
      "for (int i = 0; i < n; ++i) {",
      "  sum += values[i] * weights[i];",
      "}",
      "if (!status.ok()) return status;",
      "def forward(self, x: torch.Tensor) -> torch.Tensor:",
      "    return self.proj(F.silu(self.gate(x)) * self.up(x))",
      "std::vector<int32_t> ids = tokenizer->Encode(text, /*add_special_tokens=*/true);",
      "    # Normalize before splitting so offsets stay stable.",
      "const auto& [key, value] = *map.find(name);",
      "\tfmt.Printf(\"%d items\\n\", len(xs))",
      "SELECT id, name FROM users WHERE created_at > NOW() - INTERVAL '7 days';",
      "        self.cache[key] = value  # LRU",
      "}  // namespace tandem",
      ""};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < kTextBytes) {
    text += kLines[rng() % std::size(kLines)];
    text += '\n';
  }
  return text;
}

// One megabyte of letters with no space or punctuation: a single pre-tokenizer word.
std::string NoSpaces() {
  std::mt19937 rng(3);
  std::string text(kTextBytes, 'a');
  for (char& c : text) c = static_cast<char>('a' + rng() % 26);
  return text;
}

void RunEncode(benchmark::State& state, const std::string& text) {
  const Tokenizer* tok = GetTokenizer();
  if (tok == nullptr) {
    state.SkipWithError("set TANDEM_TOKENIZER_DIR to a directory with tokenizer.json");
    return;
  }
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->Encode(text, false);
    if (!ids.ok()) {
      state.SkipWithError(ids.status().ToString().c_str());
      return;
    }
    tokens = ids->size();
    benchmark::DoNotOptimize(ids->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}

void BM_EncodeProse(benchmark::State& state) { RunEncode(state, Prose()); }
void BM_EncodeCode(benchmark::State& state) { RunEncode(state, Code()); }
void BM_EncodeNoSpaces1MB(benchmark::State& state) { RunEncode(state, NoSpaces()); }

BENCHMARK(BM_EncodeProse)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeCode)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeNoSpaces1MB)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
