#include "common/kv/kv_transfer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/unit/testing/kv_helpers.h"

namespace tandem::kv {
namespace {

using ::testing::HasSubstr;

constexpr int kBs = 4;

KvCacheOptions Options(std::string model_id = "model-a") {
  KvCacheOptions o;
  o.layout = KvLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 4, .block_size = kBs, .dtype = DType::kF32};
  o.num_blocks = 8;
  o.model_id = std::move(model_id);
  return o;
}

std::unique_ptr<KvCacheManager> Make(const KvCacheOptions& o) { return testing::MakeKvCache(o); }

std::vector<int32_t> Prompt(int n) { return testing::Iota(n, 40); }

bool SameStats(const KvCacheStats& a, const KvCacheStats& b) {
  return a.free_blocks == b.free_blocks && a.used_blocks == b.used_blocks &&
         a.cached_blocks == b.cached_blocks && a.hits == b.hits && a.misses == b.misses &&
         a.evictions == b.evictions && a.num_sequences == b.num_sequences;
}

// Prefills `prompt` into `m` as sequence 1 with random block contents, and exports its full
// blocks. Sequence 1 stays registered.
std::string PrefillAndExport(KvCacheManager& m, const std::vector<int32_t>& prompt,
                             uint32_t seed = 1) {
  EXPECT_TRUE(m.AddSequence(1, prompt).ok());
  EXPECT_TRUE(m.Reserve(1, static_cast<int>(prompt.size())).ok());
  std::mt19937 rng(seed);
  const size_t bb = m.layout().BlockBytes();
  for (int32_t b : m.BlockTable(1)) {
    for (size_t i = 0; i < bb; ++i) m.pool_base()[b * bb + i] = static_cast<uint8_t>(rng());
  }
  m.CommitTokens(1, prompt, static_cast<int>(prompt.size()));
  const auto hashes = HashPrefixBlocks(m.model_hash(), prompt, kBs);
  auto table = m.BlockTable(1);
  table.resize(hashes.size());
  auto bytes = ExportBlocks(m, table, hashes);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or("");
}

void PutLe64(std::string& s, size_t pos, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[pos + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void Reseal(std::string& s) { PutLe64(s, s.size() - 8, XXH3_64bits(s.data(), s.size() - 8)); }

// Offset of the u64 block_bytes field (magic, version, id length, id, 5 x u32).
size_t BlockBytesOffset(const std::string& model_id) { return 4 + 4 + 4 + model_id.size() + 20; }

TEST(KvTransferTest, RoundTripIsByteExactAndHitsAfterwards) {
  auto src = Make(Options());
  auto dst = Make(Options());
  const auto prompt = Prompt(13);  // three full blocks and one token
  const std::string bytes = PrefillAndExport(*src, prompt);
  const size_t bb = src->layout().BlockBytes();
  EXPECT_EQ(bytes.size(), BlockBytesOffset("model-a") + 16 + 3 * (8 + bb) + 8);

  auto r = ImportBlocks(*dst, bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->imported, 3);
  EXPECT_EQ(r->already_present, 0);
  KvCacheStats s = dst->Stats();
  EXPECT_EQ(s.cached_blocks, 3);
  EXPECT_EQ(s.free_blocks, 5);
  EXPECT_EQ(s.used_blocks, 0);

  ASSERT_EQ(dst->AddSequence(7, prompt).value(), 12);
  EXPECT_EQ(dst->Stats().hits, 3);
  const auto src_table = src->BlockTable(1);
  const auto dst_table = dst->BlockTable(7);
  ASSERT_EQ(dst_table.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(
        std::memcmp(src->pool_base() + src_table[i] * bb, dst->pool_base() + dst_table[i] * bb, bb),
        0)
        << "block " << i;
  }

  // Importing again finds everything present and allocates nothing.
  const KvCacheStats before = dst->Stats();
  r = ImportBlocks(*dst, bytes);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->imported, 0);
  EXPECT_EQ(r->already_present, 3);
  EXPECT_TRUE(SameStats(before, dst->Stats()));
  dst->FreeSequence(7);
  EXPECT_EQ(dst->Stats().cached_blocks, 3);
}

TEST(KvTransferTest, RepeatedHashInOneExportIsImportedOnce) {
  auto src = Make(Options());
  auto dst = Make(Options());
  PrefillAndExport(*src, Prompt(5));
  const int32_t b = src->BlockTable(1)[0];
  const std::vector<int32_t> ids = {b, b};
  const std::vector<BlockHash> hashes = {123, 123};
  auto bytes = ExportBlocks(*src, ids, hashes);
  ASSERT_TRUE(bytes.ok());
  auto r = ImportBlocks(*dst, *bytes);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->imported, 1);
  EXPECT_EQ(r->already_present, 1);
  EXPECT_TRUE(dst->ContainsHash(123));
}

TEST(KvTransferTest, ExportValidatesArguments) {
  auto m = Make(Options());
  PrefillAndExport(*m, Prompt(5));
  const std::vector<BlockHash> one = {1};
  const std::vector<int32_t> out_of_range = {8};
  const std::vector<int32_t> free_block = {5};
  const std::vector<int32_t> two = {0, 1};
  EXPECT_EQ(ExportBlocks(*m, two, one).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportBlocks(*m, out_of_range, one).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportBlocks(*m, free_block, one).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

struct MismatchCase {
  const char* field;
  void (*mutate)(KvCacheOptions&);
};

TEST(KvTransferTest, RejectsDescriptorMismatchNamingTheField) {
  const MismatchCase cases[] = {
      {"model_id", [](KvCacheOptions& o) { o.model_id = "model-b"; }},
      {"dtype", [](KvCacheOptions& o) { o.layout.dtype = DType::kBF16; }},
      {"dtype", [](KvCacheOptions& o) { o.layout.dtype = DType::kI8; }},
      {"block_size", [](KvCacheOptions& o) { o.layout.block_size = 8; }},
      {"num_layers", [](KvCacheOptions& o) { o.layout.num_layers = 3; }},
      {"num_kv_heads", [](KvCacheOptions& o) { o.layout.num_kv_heads = 1; }},
      {"head_dim", [](KvCacheOptions& o) { o.layout.head_dim = 8; }},
  };
  for (const MismatchCase& c : cases) {
    SCOPED_TRACE(c.field);
    KvCacheOptions o = Options();
    c.mutate(o);
    auto src = Make(o);
    const std::string bytes = PrefillAndExport(*src, Prompt(17));
    auto dst = Make(Options());
    const KvCacheStats before = dst->Stats();
    auto r = ImportBlocks(*dst, bytes);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(), HasSubstr(std::string(c.field) + " mismatch"));
    EXPECT_TRUE(SameStats(before, dst->Stats()));
  }
  KvDescriptor a{.model_id = "x", .layout = Options().layout};
  KvDescriptor b = a;
  EXPECT_EQ(a, b);
  b.layout.head_dim = 2;
  EXPECT_NE(a, b);
}

TEST(KvTransferTest, RejectsEveryTruncation) {
  auto src = Make(Options());
  const std::string bytes = PrefillAndExport(*src, Prompt(9));
  auto dst = Make(Options());
  const KvCacheStats before = dst->Stats();
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto r = ImportBlocks(*dst, std::string_view(bytes).substr(0, len));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << "length " << len;
  }
  EXPECT_EQ(ImportBlocks(*dst, bytes + "x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SameStats(before, dst->Stats()));
  EXPECT_TRUE(ImportBlocks(*dst, bytes).ok());
}

TEST(KvTransferTest, RejectsEveryFlippedByte) {
  auto src = Make(Options());
  const std::string bytes = PrefillAndExport(*src, Prompt(9));
  auto dst = Make(Options());
  const KvCacheStats before = dst->Stats();
  const size_t payload_start = BlockBytesOffset("model-a") + 16;
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    std::string bad = bytes;
    bad[pos] ^= 0x10;
    auto r = ImportBlocks(*dst, bad);
    ASSERT_FALSE(r.ok()) << "byte " << pos;
    if (pos >= payload_start) {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << "byte " << pos;
    }
  }
  EXPECT_TRUE(SameStats(before, dst->Stats()));
}

TEST(KvTransferTest, RejectsLyingSizesAndAbsurdCounts) {
  auto src = Make(Options());
  const std::string bytes = PrefillAndExport(*src, Prompt(9));
  auto dst = Make(Options());
  const KvCacheStats before = dst->Stats();
  const size_t bb_off = BlockBytesOffset("model-a");
  auto expect_invalid = [&](std::string bad, const char* what) {
    Reseal(bad);  // a valid checksum, so only the structural checks can catch it
    auto r = ImportBlocks(*dst, bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << what << ": " << r.status();
  };
  std::string bad = bytes;
  PutLe64(bad, bb_off + 8, uint64_t{1} << 60);
  expect_invalid(bad, "absurd block count");
  bad = bytes;
  PutLe64(bad, bb_off + 8, 3);
  expect_invalid(bad, "one block too many");
  bad = bytes;
  PutLe64(bad, bb_off + 8, 1);
  expect_invalid(bad, "one block too few");
  bad = bytes;
  PutLe64(bad, bb_off, 64);
  expect_invalid(bad, "block_bytes lies");
  bad = bytes;
  bad[8] = static_cast<char>(0xff);  // model id length
  bad[11] = static_cast<char>(0x7f);
  expect_invalid(bad, "model id length");
  bad = bytes;
  bad[0] = 'X';
  expect_invalid(bad, "magic");
  bad = bytes;
  bad[4] = 2;
  expect_invalid(bad, "version");
  bad = bytes;
  bad[BlockBytesOffset("model-a") - 20] = 9;  // dtype
  expect_invalid(bad, "dtype");
  bad = bytes;
  std::memset(&bad[BlockBytesOffset("model-a") - 8], 0xff, 4);  // num_kv_heads = -1
  expect_invalid(bad, "num_kv_heads");
  EXPECT_TRUE(SameStats(before, dst->Stats()));
}

TEST(KvTransferTest, ImportNeedsPrefixCaching) {
  auto src = Make(Options());
  const std::string bytes = PrefillAndExport(*src, Prompt(9));
  KvCacheOptions o = Options();
  o.enable_prefix_caching = false;
  auto dst = Make(o);
  EXPECT_EQ(ImportBlocks(*dst, bytes).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(dst->Stats().free_blocks, 8);
}

TEST(KvTransferTest, ImportThatDoesNotFitChangesNothing) {
  KvCacheOptions big = Options();
  big.num_blocks = 16;
  auto src = Make(big);
  const std::string bytes = PrefillAndExport(*src, Prompt(37));  // 9 full blocks
  auto dst = Make(Options());                                    // 8 blocks
  ASSERT_TRUE(dst->AddSequence(1, Prompt(2)).ok());
  const KvCacheStats before = dst->Stats();
  auto r = ImportBlocks(*dst, bytes);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(SameStats(before, dst->Stats()));
}

TEST(KvTransferTest, ImportEvictsOthersButNotBlocksItFindsPresent) {
  auto src = Make(Options());
  const auto prompt = Prompt(21);  // 5 full blocks
  const std::string bytes = PrefillAndExport(*src, prompt);
  auto dst = Make(Options());
  // dst caches the first block of the same prompt (oldest) plus 3 unrelated blocks.
  ASSERT_TRUE(dst->AddSequence(1, prompt).ok());
  ASSERT_TRUE(dst->Reserve(1, 4).ok());
  dst->CommitTokens(1, prompt, 4);
  dst->FreeSequence(1);  // first block is now the oldest cached block
  std::vector<int32_t> other(12);
  std::iota(other.begin(), other.end(), 900);
  ASSERT_TRUE(dst->AddSequence(2, other).ok());
  ASSERT_TRUE(dst->Reserve(2, 12).ok());
  dst->CommitTokens(2, other, 12);
  dst->FreeSequence(2);
  const std::vector<int32_t> active = {1, 2, 3};  // a running sequence holding 3 blocks
  ASSERT_TRUE(dst->AddSequence(9, active).ok());
  ASSERT_TRUE(dst->Reserve(9, 12).ok());
  ASSERT_EQ(dst->Stats().cached_blocks, 4);
  ASSERT_EQ(dst->Stats().free_blocks, 1);
  // 4 new blocks: the free one plus 3 evictions, which must skip the oldest cached block because
  // the import itself needs it.
  auto r = ImportBlocks(*dst, bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->imported, 4);
  EXPECT_EQ(r->already_present, 1);
  EXPECT_EQ(dst->Stats().evictions, 3);
  EXPECT_EQ(dst->Stats().cached_blocks, 5);
  ASSERT_EQ(dst->AddSequence(3, prompt).value(), 20);
}

}  // namespace
}  // namespace tandem::kv
