#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/util/file_util.h"

namespace tandem::model {

// Element types a safetensors file may declare. Only kF32/kF16/kBF16 can back weights.
enum class StDType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

struct TensorEntry {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;
};

// Parses and validates the header of a safetensors file held in `file` (the whole file):
// header length within the file, JSON object, every entry's dtype/shape/offsets consistent
// with its byte size and inside the data section, no overlaps. Errors name `file_name` and the
// tensor. Safe on arbitrary bytes (fuzzed).
absl::StatusOr<std::vector<TensorEntry>> ParseSafetensorsHeader(const uint8_t* file, size_t size,
                                                                std::string_view file_name,
                                                                uint64_t* data_start);

size_t StDTypeSize(StDType t);
std::string_view StDTypeName(StDType t);

// One tensor to write: its bytes, little-endian, row-major.
struct SafetensorsTensor {
  std::string name;
  StDType dtype = StDType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Writes `tensors` in order as a safetensors file at `path` (the data 8-byte aligned).
absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<SafetensorsTensor>& tensors);

// A memory-mapped safetensors file with its parsed header.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::vector<TensorEntry>& tensors() const { return tensors_; }
  const std::string& path() const { return file_->path(); }
  // Start of the tensor's bytes inside the mapping.
  const uint8_t* Data(const TensorEntry& t) const { return file_->data() + data_start_ + t.begin; }
  // XXH3 of the file's size, its header (every tensor's name, dtype, shape and offsets) and
  // each tensor's bytes (up to 64 KiB, else 16 samples of 4 KiB spread over it), chained from
  // `seed`: weights trained further or replaced, even in one tensor, have another, at the cost
  // of at most 64 KiB read per tensor instead of the whole file.
  uint64_t Fingerprint(uint64_t seed) const;

 private:
  SafetensorsFile(std::unique_ptr<MappedFile> file, std::vector<TensorEntry> tensors,
                  uint64_t data_start)
      : file_(std::move(file)), tensors_(std::move(tensors)), data_start_(data_start) {}
  std::unique_ptr<MappedFile> file_;
  std::vector<TensorEntry> tensors_;
  uint64_t data_start_;
};

}  // namespace tandem::model
