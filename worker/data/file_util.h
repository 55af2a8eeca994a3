// Whole-file reads for the data readers: plain or gzip, chosen by content, with errors
// that name the file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shoal {
namespace data {

bool FileExists(const std::string& path);  // a regular file (or a link to one)
bool DirExists(const std::string& path);

// Reads all of `path` into memory, inflating it when it is gzip (detected by its magic
// bytes, not its name, so a renamed file still works). A corrupt or truncated gzip
// stream throws shoal::Error naming the file and how many bytes came out before it broke.
std::vector<uint8_t> ReadFileBytes(const std::string& path);

}  // namespace data
}  // namespace shoal
