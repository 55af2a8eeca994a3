// Whole-file reads for the data readers: plain or gzip, chosen by content, with errors
// that name the file.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace shoal {
namespace data {

bool FileExists(const std::string& path);  // a regular file (or a link to one)
bool DirExists(const std::string& path);

// Reads all of `path` into memory, inflating it when it is gzip (detected by its magic
// bytes, not its name, so a renamed file still works). A corrupt or truncated gzip
// stream throws shoal::Error naming the file and how many bytes came out before it broke.
//
// A gzip file is capped in what it may inflate to, because a few KiB of gzip can inflate
// to many GiB (a gzip bomb) and take the host's memory down with the worker:
// `max_bytes` always, and, for formats whose header says how big the file is, the size
// `declared_size` returns once `header_bytes` have been inflated (-1: the header does not
// say; a header it rejects throws from there).
constexpr int64_t kMaxInflatedBytes = int64_t(4) << 30;
struct InflateLimit {
  int64_t max_bytes = kMaxInflatedBytes;
  size_t header_bytes = 0;
  std::function<int64_t(const uint8_t* header)> declared_size;
  std::string what;  // what declared the size, for the error: "its IDX header"
};
std::vector<uint8_t> ReadFileBytes(const std::string& path, const InflateLimit& limit = {});

}  // namespace data
}  // namespace shoal
