#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

// Reads a whole (small) file; NotFound / InvalidArgument with the path in the message.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes = 1 << 30);
absl::Status WriteStringToFile(const std::string& path, std::string_view data);
bool FileExists(const std::string& path);

// A read-only memory mapping of a whole file. Weights stay on disk pages the kernel can share
// between processes and drop under pressure.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace tandem
