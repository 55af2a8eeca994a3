#include "worker/data/idx_reader.h"

#include <algorithm>

#include "common/error.h"
#include "worker/data/file_util.h"

namespace shoal {
namespace data {

namespace {

struct IdxFile {
  std::string path;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // whole file; payload starts at header_size
  size_t header_size = 0;
};

// The IDX header: two zero bytes, a type code (0x08 = unsigned byte), the number of
// dimensions, then each dimension as a big-endian uint32. Checks `b` (at least 4 bytes,
// and 4 + 4 * want_dims once the magic is right) and returns the file size it declares.
int64_t ParseIdxHeader(const std::string& path, const uint8_t* b, size_t size, int want_dims, const char* what,
                       std::vector<int64_t>* dims) {
  const std::string expect_magic = want_dims == 3 ? "0x00000803" : "0x00000801";
  if (size < 4)
    throw Error(path + ": not an IDX " + what + " file: " + std::to_string(size) + " bytes, too short for a header");
  if (b[0] != 0 || b[1] != 0 || b[2] != 0x08 || b[3] != want_dims) {
    char got[16];
    snprintf(got, sizeof(got), "0x%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
    throw Error(path + ": bad magic number " + got + ", expected " + expect_magic + " (IDX " + what +
                ", unsigned bytes, " + std::to_string(want_dims) + " dims)");
  }
  const size_t header_size = 4 + 4 * size_t(want_dims);
  if (size < header_size)
    throw Error(path + ": truncated header: expected " + std::to_string(header_size) + " bytes, got " +
                std::to_string(size));
  int64_t payload = 1;
  for (int d = 0; d < want_dims; ++d) {
    const uint8_t* p = b + 4 + 4 * d;
    int64_t v = (int64_t(p[0]) << 24) | (int64_t(p[1]) << 16) | (int64_t(p[2]) << 8) | int64_t(p[3]);
    if (d > 0 && v == 0) throw Error(path + ": dimension " + std::to_string(d) + " is zero");
    if (dims) dims->push_back(v);
    // Checked before multiplying: two 32-bit dimensions overflow int64.
    if (v > 0 && payload > (int64_t(1) << 40) / v)
      throw Error(path + ": header dimensions are implausibly large (over 2^40 bytes)");
    payload *= v;
  }
  return int64_t(header_size) + payload;
}

IdxFile ReadIdxFile(const std::string& path, int want_dims, const char* what) {
  IdxFile f;
  f.path = path;
  // A gzip file may inflate to no more than its header declares.
  InflateLimit limit;
  limit.header_bytes = 4 + 4 * size_t(want_dims);
  limit.declared_size = [&](const uint8_t* h) {
    return ParseIdxHeader(path, h, limit.header_bytes, want_dims, what, nullptr);
  };
  limit.what = "its IDX header";
  f.bytes = ReadFileBytes(path, limit);
  const std::vector<uint8_t>& b = f.bytes;
  f.header_size = 4 + 4 * size_t(want_dims);
  const int64_t expected = ParseIdxHeader(path, b.data(), b.size(), want_dims, what, &f.dims);
  if (int64_t(b.size()) != expected)
    throw Error(path + ": " + (int64_t(b.size()) < expected ? "truncated" : "trailing bytes") + ": expected " +
                std::to_string(expected) + " bytes for " + std::to_string(f.dims[0]) + " " + what + ", got " +
                std::to_string(b.size()));
  return f;
}

std::string Tried(const std::vector<std::string>& c) {
  std::string s;
  for (size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + c[i];
  return s;
}

std::string FirstExisting(const std::vector<std::string>& candidates, const std::string& path, const char* what) {
  for (const std::string& c : candidates)
    if (FileExists(c)) return c;
  throw Error(path + ": no IDX " + what + " file found (tried " + Tried(candidates) + ")");
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Finds the images and labels files for `path` (a prefix or the images file itself).
void Resolve(const std::string& path, std::string* images, std::string* labels) {
  if (FileExists(path)) {
    *images = path;
    std::vector<std::string> cands;
    for (const char* from : {"images-idx3-ubyte", "images.idx3-ubyte"}) {
      size_t at = path.rfind(from);
      if (at == std::string::npos) continue;
      std::string base = path.substr(0, at) + (from[6] == '-' ? "labels-idx1-ubyte" : "labels.idx1-ubyte");
      cands.push_back(base);
      cands.push_back(base + ".gz");
    }
    if (cands.empty())
      throw Error(path +
                  ": cannot tell the labels file from this name (give the images file, named *images-idx3-ubyte*, "
                  "or the prefix before -images-idx3-ubyte)");
    *labels = FirstExisting(cands, path, "labels");
    return;
  }
  if (DirExists(path))
    throw Error(path + ": is a directory; give a prefix such as " + path + "/train (for " + path +
                "/train-images-idx3-ubyte[.gz] and its labels)");
  std::string prefix = path;
  if (EndsWith(prefix, "-")) prefix.pop_back();
  *images = FirstExisting({prefix + "-images-idx3-ubyte", prefix + "-images-idx3-ubyte.gz",
                           prefix + "-images.idx3-ubyte", prefix + "-images.idx3-ubyte.gz"},
                          path, "images");
  *labels = FirstExisting({prefix + "-labels-idx1-ubyte", prefix + "-labels-idx1-ubyte.gz",
                           prefix + "-labels.idx1-ubyte", prefix + "-labels.idx1-ubyte.gz"},
                          path, "labels");
}

}  // namespace

std::shared_ptr<Dataset> ReadIdx(const std::string& path, const DatasetOptions& options) {
  SHOAL_CHECK(!path.empty(), "[data] idx: empty path (expected a prefix like /usr/share/datasets/fashion-mnist/train)");
  std::string images_path, labels_path;
  Resolve(path, &images_path, &labels_path);
  IdxFile labels = ReadIdxFile(labels_path, 1, "labels");
  IdxFile images = ReadIdxFile(images_path, 3, "images");
  if (images.dims[0] != labels.dims[0])
    throw Error(labels_path + ": " + std::to_string(labels.dims[0]) + " labels but " + images_path + " has " +
                std::to_string(images.dims[0]) + " images");

  int64_t n = images.dims[0];
  if (options.max_samples > 0) n = std::min(n, options.max_samples);
  const int64_t h = images.dims[1], w = images.dims[2];
  const uint8_t* lab = labels.bytes.data() + labels.header_size;
  std::vector<int32_t> y(static_cast<size_t>(n));
  int32_t max_label = 0;
  for (int64_t i = 0; i < n; ++i) {
    y[size_t(i)] = lab[i];
    if (options.num_classes > 0 && lab[i] >= options.num_classes)
      throw Error(labels_path + ": label " + std::to_string(lab[i]) + " of sample " + std::to_string(i) +
                  " is outside 0.." + std::to_string(options.num_classes - 1));
    max_label = std::max<int32_t>(max_label, lab[i]);
  }
  const int64_t classes = options.num_classes > 0 ? options.num_classes : max_label + 1;
  // Drop the header in place rather than copying 47 MB of pixels.
  std::vector<uint8_t> pixels = std::move(images.bytes);
  pixels.erase(pixels.begin(), pixels.begin() + long(images.header_size));
  if (n < images.dims[0]) {
    pixels.resize(size_t(n * h * w));
    pixels.shrink_to_fit();
  }
  return Dataset::FromU8(images_path, {1, h, w}, std::move(pixels), std::move(y), classes);
}

}  // namespace data
}  // namespace shoal
