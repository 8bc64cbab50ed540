#include "tools/make_random_model/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/util/thread_pool.h"
#include "tools/make_random_model/random_fill.h"

namespace tandem::make_random_model {
namespace {

// Elements generated per write: 64 fill blocks (16 MiB of floats) bounds memory for any model.
constexpr int64_t kChunkBlocks = 64;

const char* SafetensorsDtype(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI8:  // KV only; ParseDType never yields it
      break;
  }
  return "";
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

std::string SafetensorsHeader(const std::vector<const TensorSpec*>& tensors, DType dtype) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const TensorSpec* t : tensors) {
    const int64_t bytes = t->NumElements() * static_cast<int64_t>(DTypeSize(dtype));
    header[t->name] = {{"dtype", SafetensorsDtype(dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

absl::StatusOr<int64_t> WriteSafetensors(const std::string& path,
                                         const std::vector<const TensorSpec*>& tensors, DType dtype,
                                         const TensorSource& source) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  if (!file) return IoError("cannot create", path);
  const std::string header = SafetensorsHeader(tensors, dtype);
  if (std::fwrite(header.data(), 1, header.size(), file.get()) != header.size()) {
    return IoError("cannot write", path);
  }
  const size_t elem_size = DTypeSize(dtype);
  const int64_t chunk = kChunkBlocks * kFillBlock;
  std::vector<float> values;
  std::vector<char> bytes;
  ThreadPool& pool = DefaultThreadPool();
  int64_t written = 0;
  for (const TensorSpec* t : tensors) {
    const int64_t total = t->NumElements();
    for (int64_t begin = 0; begin < total; begin += chunk) {
      const int64_t n = std::min(chunk, total - begin);
      values.resize(n);
      bytes.resize(n * elem_size);
      const int64_t blocks = (n + kFillBlock - 1) / kFillBlock;
      pool.ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
        const int64_t e0 = b0 * kFillBlock;
        const int64_t e1 = std::min(n, b1 * kFillBlock);
        source(*t, begin / kFillBlock + b0, e1 - e0, values.data() + e0);
        FromFloat(dtype, values.data() + e0, bytes.data() + e0 * elem_size, e1 - e0);
      });
      if (std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
        return IoError("cannot write", path);
      }
      written += static_cast<int64_t>(bytes.size());
    }
  }
  std::FILE* f = file.release();
  if (std::fclose(f) != 0) return IoError("cannot close", path);
  return written;
}

}  // namespace tandem::make_random_model
