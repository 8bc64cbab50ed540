#include "common/model/safetensors.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::model {
namespace {

// The format caps headers at 100 MB; anything larger is corrupt.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr size_t kMaxRank = 8;

struct DTypeSpec {
  const char* name;
  StDType type;
  size_t size;
};
constexpr DTypeSpec kDTypes[] = {
    {"F64", StDType::kF64, 8},   {"F32", StDType::kF32, 4},        {"F16", StDType::kF16, 2},
    {"BF16", StDType::kBF16, 2}, {"I64", StDType::kI64, 8},        {"I32", StDType::kI32, 4},
    {"I16", StDType::kI16, 2},   {"I8", StDType::kI8, 1},          {"U8", StDType::kU8, 1},
    {"BOOL", StDType::kBool, 1}, {"F8_E4M3", StDType::kF8E4M3, 1}, {"F8_E5M2", StDType::kF8E5M2, 1},
};

absl::Status EntryError(std::string_view file, const std::string& tensor, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(file), ": tensor \"", tensor, "\": ", std::string(what)));
}

absl::StatusOr<TensorEntry> ParseEntry(const std::string& name, const nlohmann::json& v,
                                       std::string_view file, uint64_t data_size) {
  if (!v.is_object()) return EntryError(file, name, "entry must be an object");
  TensorEntry t;
  t.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) return EntryError(file, name, "missing string \"dtype\"");
  const DTypeSpec* spec = nullptr;
  for (const auto& s : kDTypes) {
    if (dt->get<std::string>() == s.name) spec = &s;
  }
  if (spec == nullptr) return EntryError(file, name, absl::StrCat("unknown dtype ", dt->dump()));
  t.dtype = spec->type;
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array() || sh->size() > kMaxRank) {
    return EntryError(file, name, "\"shape\" must be a list of at most 8 dimensions");
  }
  uint64_t elements = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
      return EntryError(file, name, absl::StrCat("bad dimension ", d.dump()));
    }
    uint64_t dim = d.get<uint64_t>();
    if (dim > 0 && elements > data_size / dim) {
      return EntryError(file, name, "shape is larger than the file");
    }
    elements *= dim;
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned()) {
    return EntryError(file, name, "\"data_offsets\" must be [begin, end]");
  }
  t.begin = (*off)[0].get<uint64_t>();
  t.end = (*off)[1].get<uint64_t>();
  if (t.begin > t.end || t.end > data_size) {
    return EntryError(file, name,
                      absl::StrCat("data_offsets [", t.begin, ", ", t.end,
                                   "] lie outside the data section of ", data_size, " bytes"));
  }
  if (elements > data_size / spec->size || elements * spec->size != t.end - t.begin) {
    return EntryError(file, name,
                      absl::StrCat("shape needs ", elements, " elements of ", spec->size,
                                   " bytes but data_offsets span ", t.end - t.begin, " bytes"));
  }
  return t;
}

}  // namespace

size_t StDTypeSize(StDType t) {
  for (const auto& s : kDTypes) {
    if (s.type == t) return s.size;
  }
  return 0;
}

std::string_view StDTypeName(StDType t) {
  for (const auto& s : kDTypes) {
    if (s.type == t) return s.name;
  }
  return "?";
}

absl::StatusOr<std::vector<TensorEntry>> ParseSafetensorsHeader(const uint8_t* file, size_t size,
                                                                std::string_view file_name,
                                                                uint64_t* data_start) {
  std::string fname(file_name);
  if (size < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        fname, ": truncated: ", size, " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[i];
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(fname, ": header length ", header_len,
                                                   " exceeds the file size ", size,
                                                   " (truncated or not a safetensors file)"));
  }
  std::string_view header(reinterpret_cast<const char*>(file + 8), header_len);
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json j,
                          ParseJsonObject(header, absl::StrCat(fname, " header")));
  uint64_t data_size = size - 8 - header_len;
  std::vector<TensorEntry> out;
  out.reserve(j.size());
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    TANDEM_ASSIGN_OR_RETURN(TensorEntry t, ParseEntry(it.key(), it.value(), fname, data_size));
    out.push_back(std::move(t));
  }
  std::vector<const TensorEntry*> by_offset;
  for (const auto& t : out) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return EntryError(fname, by_offset[i]->name,
                        absl::StrCat("overlaps tensor \"", by_offset[i - 1]->name, "\""));
    }
  }
  *data_start = 8 + header_len;
  return out;
}

uint64_t SafetensorsFile::Fingerprint(uint64_t seed) const {
  constexpr size_t kSamples = 16, kSampleBytes = 4096;
  const uint8_t* bytes = file_->data();
  const size_t size = file_->size();
  const size_t start = std::min<size_t>(data_start_, size);
  uint64_t h = XXH3_64bits_withSeed(bytes, start, seed ^ size);
  // Every tensor sampled on its own, so an edit confined to one tensor (one layer fine-tuned, a
  // merged adapter) changes the fingerprint however large the file: all of a tensor up to
  // kSamples windows, else kSamples windows spread evenly from its first byte to its last.
  for (const TensorEntry& t : tensors_) {
    const uint8_t* data = bytes + start + t.begin;
    const size_t n = t.end - t.begin;
    if (n <= kSamples * kSampleBytes) {
      h = XXH3_64bits_withSeed(data, n, h);
      continue;
    }
    const size_t span = n - kSampleBytes;
    for (size_t i = 0; i < kSamples; ++i) {
      h = XXH3_64bits_withSeed(data + span * i / (kSamples - 1), kSampleBytes, h);
    }
  }
  return h;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  uint64_t data_start = 0;
  TANDEM_ASSIGN_OR_RETURN(std::vector<TensorEntry> tensors,
                          ParseSafetensorsHeader(file->data(), file->size(), path, &data_start));
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(std::move(file), std::move(tensors), data_start));
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<SafetensorsTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    header[t.name] = {{"dtype", std::string(StDTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + offset);
  for (const SafetensorsTensor& t : tensors) out += t.bytes;
  return WriteStringToFile(path, out);
}

}  // namespace tandem::model
