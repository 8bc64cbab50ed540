#include "common/kv/kv_transfer.h"

#include <xxhash.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/block_pool.h"
#include "common/kv/kv_rows.h"

namespace tandem::kv {
namespace {

constexpr size_t kChecksumBytes = 8;

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t LoadLe(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Bounds-checked little-endian reader; every read fails cleanly past the end.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  bool U32(uint32_t* v) { return Fixed(4, v); }
  bool U64(uint64_t* v) { return Fixed(8, v); }
  bool Bytes(size_t n, std::string_view* v) {
    if (remaining() < n) return false;
    *v = data_.substr(pos_, n);
    pos_ += n;
    return true;
  }

 private:
  template <typename T>
  bool Fixed(int n, T* v) {
    if (remaining() < static_cast<size_t>(n)) return false;
    *v = static_cast<T>(LoadLe(data_.data() + pos_, n));
    pos_ += n;
    return true;
  }
  std::string_view data_;
  size_t pos_ = 0;
};

absl::Status Truncated(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("KV import: input truncated in ", what));
}

// Parses and checks the header; on success `reader` is at the first block.
absl::StatusOr<KvDescriptor> ParseHeader(Reader& reader, uint64_t* num_blocks) {
  std::string_view magic;
  uint32_t version = 0;
  if (!reader.Bytes(4, &magic)) return Truncated("magic");
  if (std::memcmp(magic.data(), kKvTransferMagic, 4) != 0) {
    return absl::InvalidArgumentError("KV import: bad magic (not a Tandem KV export)");
  }
  if (!reader.U32(&version)) return Truncated("version");
  if (version != kKvTransferVersion) {
    return absl::InvalidArgumentError(absl::StrCat("KV import: unsupported version ", version,
                                                   " (expected ", kKvTransferVersion, ")"));
  }
  uint32_t id_len = 0;
  if (!reader.U32(&id_len)) return Truncated("model id length");
  if (id_len > kMaxModelIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV import: model id length ", id_len, " exceeds ", kMaxModelIdBytes));
  }
  KvDescriptor desc;
  std::string_view id;
  if (!reader.Bytes(id_len, &id)) return Truncated("model id");
  desc.model_id = std::string(id);
  uint32_t dtype = 0, block_size = 0, layers = 0, heads = 0, head_dim = 0;
  if (!reader.U32(&dtype) || !reader.U32(&block_size) || !reader.U32(&layers) ||
      !reader.U32(&heads) || !reader.U32(&head_dim)) {
    return Truncated("layout");
  }
  desc.mixed = (dtype & kMixedKvFlag) != 0;
  dtype &= ~kMixedKvFlag;
  if (dtype > static_cast<uint32_t>(DType::kI8)) {
    return absl::InvalidArgumentError(absl::StrCat("KV import: unknown dtype ", dtype));
  }
  // Values above INT32_MAX wrap negative here and are rejected by ValidateKvLayout.
  desc.layout = KvLayout{.num_layers = static_cast<int>(layers),
                         .num_kv_heads = static_cast<int>(heads),
                         .head_dim = static_cast<int>(head_dim),
                         .block_size = static_cast<int>(block_size),
                         .dtype = static_cast<DType>(dtype)};
  absl::Status s = ValidateKvLayout(desc.layout);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("KV import: ", s.message()));
  uint64_t block_bytes = 0;
  if (!reader.U64(&block_bytes)) return Truncated("block bytes");
  if (block_bytes != desc.layout.BlockBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("KV import: block_bytes ", block_bytes,
                                                   " does not match the layout's ",
                                                   desc.layout.BlockBytes()));
  }
  if (!reader.U64(num_blocks)) return Truncated("block count");
  // Exact size check: catches truncation, trailing bytes and counts that cannot be true.
  const uint64_t record = 8 + block_bytes;
  const uint64_t room =
      reader.remaining() >= kChecksumBytes ? reader.remaining() - kChecksumBytes : 0;
  if (*num_blocks > room / record || *num_blocks * record != room ||
      reader.remaining() < kChecksumBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV import: header claims ", *num_blocks, " blocks of ", block_bytes,
                     " bytes but ", reader.remaining(), " bytes follow (truncated or corrupt)"));
  }
  return desc;
}

absl::Status CompareDescriptor(const KvDescriptor& got, const KvDescriptor& want) {
  auto mismatch = [](const char* field, const auto& g, const auto& w) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV import: ", field, " mismatch: data has ", g, ", this cache has ", w));
  };
  if (got.model_id != want.model_id) {
    return mismatch("model_id", absl::StrCat("'", got.model_id, "'"),
                    absl::StrCat("'", want.model_id, "'"));
  }
  const KvLayout& g = got.layout;
  const KvLayout& w = want.layout;
  auto name = [](const KvDescriptor& d) {
    return d.mixed ? absl::StrCat("mixed (", std::string(DTypeName(d.layout.dtype)), " + int8)")
                   : std::string(DTypeName(d.layout.dtype));
  };
  // A mixed cache's block is of its wide dtype or int8.
  const bool dtype_ok = g.dtype == w.dtype || (want.mixed && g.dtype == DType::kI8);
  if (got.mixed != want.mixed || !dtype_ok) {
    KvDescriptor sender = got;
    if (got.mixed && got.layout.dtype == DType::kI8) sender.layout.dtype = want.layout.dtype;
    return mismatch("KV dtype", name(sender), name(want));
  }
  if (g.block_size != w.block_size) return mismatch("block_size", g.block_size, w.block_size);
  if (g.num_layers != w.num_layers) return mismatch("num_layers", g.num_layers, w.num_layers);
  if (g.num_kv_heads != w.num_kv_heads) {
    return mismatch("num_kv_heads", g.num_kv_heads, w.num_kv_heads);
  }
  if (g.head_dim != w.head_dim) return mismatch("head_dim", g.head_dim, w.head_dim);
  return absl::OkStatus();
}

}  // namespace

KvDescriptor DescriptorOf(const KvCacheManager& manager) {
  return KvDescriptor{
      .model_id = manager.model_id(), .layout = manager.layout(), .mixed = manager.mixed()};
}

size_t ExportedBytes(const KvDescriptor& desc, size_t block_bytes, size_t blocks) {
  // magic, version, the model id and its length, dtype, 4 geometry fields, block bytes, count;
  // per block its hash and bytes; the checksum.
  return 4 + 4 + 4 + desc.model_id.size() + 4 + 4 * 4 + 8 + 8 + blocks * (8 + block_bytes) +
         kChecksumBytes;
}

absl::StatusOr<std::string> ExportBlocks(KvCacheManager& manager,
                                         std::span<const int32_t> block_ids,
                                         std::span<const BlockHash> hashes) {
  if (block_ids.size() != hashes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV export: ", block_ids.size(), " block ids but ", hashes.size(), " hashes"));
  }
  absl::Status live = manager.CheckBlocksLive(block_ids);
  if (!live.ok()) return live;
  KvDescriptor desc = DescriptorOf(manager);
  if (desc.model_id.size() > kMaxModelIdBytes) {
    return absl::InvalidArgumentError("KV export: model id too long");
  }
  const KvArena& arena = manager.arena();
  if (!block_ids.empty()) desc.layout = arena.LayoutOf(block_ids[0]);
  const KvLayout& l = desc.layout;
  const size_t block_bytes = l.BlockBytes();
  std::vector<uint8_t> scratch;  // a block in device memory, copied out
  std::string out;
  out.reserve(ExportedBytes(desc, block_bytes, block_ids.size()));
  out.append(kKvTransferMagic, 4);
  PutU32(out, kKvTransferVersion);
  PutU32(out, static_cast<uint32_t>(desc.model_id.size()));
  out.append(desc.model_id);
  PutU32(out, static_cast<uint32_t>(l.dtype) | (desc.mixed ? kMixedKvFlag : 0));
  for (int v : {l.block_size, l.num_layers, l.num_kv_heads, l.head_dim}) {
    PutU32(out, static_cast<uint32_t>(v));
  }
  PutU64(out, block_bytes);
  PutU64(out, block_ids.size());
  for (size_t i = 0; i < block_ids.size(); ++i) {
    PutU64(out, hashes[i]);
    const size_t at = out.size();
    out.resize(at + block_bytes);
    ConvertBlock(manager.ReadableBlock(block_ids[i], scratch), arena.LayoutOf(block_ids[i]),
                 reinterpret_cast<uint8_t*>(out.data() + at), l);
  }
  PutU64(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

absl::StatusOr<ImportResult> ImportBlocks(KvCacheManager& manager, std::string_view bytes) {
  Reader reader(bytes);
  uint64_t num_blocks = 0;
  auto desc = ParseHeader(reader, &num_blocks);
  if (!desc.ok()) return desc.status();
  const size_t payload = bytes.size() - kChecksumBytes;
  const uint64_t want_sum = LoadLe(bytes.data() + payload, 8);
  if (XXH3_64bits(bytes.data(), payload) != want_sum) {
    return absl::DataLossError("KV import: checksum mismatch (data corrupted in transit)");
  }
  absl::Status same = CompareDescriptor(*desc, DescriptorOf(manager));
  if (!same.ok()) return same;
  const size_t block_bytes = desc->layout.BlockBytes();
  std::vector<BlockHash> hashes(num_blocks);
  std::vector<const uint8_t*> data(num_blocks);
  for (uint64_t i = 0; i < num_blocks; ++i) {
    std::string_view block;
    reader.U64(&hashes[i]);  // sizes were checked exactly in ParseHeader
    reader.Bytes(block_bytes, &block);
    data[i] = reinterpret_cast<const uint8_t*>(block.data());
  }
  return manager.InsertCachedBlocks(hashes, data, desc->layout);
}

}  // namespace tandem::kv
