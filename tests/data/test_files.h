// Helpers that write small data files (IDX, CIFAR-10/100 binary, gzip) into a per-test
// temporary directory.
#pragma once
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shoal {
namespace testdata {

// A fresh directory under TEST_TMPDIR (or /tmp), removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/shoal_data_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) ADD_FAILURE() << "mkdtemp failed";
    path_ = buf.data();
  }
  ~TempDir() { (void)!system(("rm -rf '" + path_ + "'").c_str()); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) fwrite(bytes.data(), 1, bytes.size(), f);
  fclose(f);
}

inline void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

// A gzip bomb: `head`, then `zeros` zero bytes, compressed at the best ratio (about
// 1000:1, so 64 MiB of zeros is a 64 KiB file).
inline void WriteGzipBomb(const std::string& path, const std::vector<uint8_t>& head, int64_t zeros) {
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr) << path;
  if (!head.empty()) gzwrite(f, head.data(), unsigned(head.size()));
  std::vector<uint8_t> z(1 << 20, 0);
  for (int64_t left = zeros; left > 0; left -= int64_t(z.size()))
    gzwrite(f, z.data(), unsigned(std::min<int64_t>(left, int64_t(z.size()))));
  gzclose(f);
}

inline void PutBE32(std::vector<uint8_t>* b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b->push_back(uint8_t(v >> s));
}

// IDX images: n x h x w, pixel (i, k) = (i * 7 + k) % 256.
inline std::vector<uint8_t> IdxImages(uint32_t n, uint32_t h, uint32_t w) {
  std::vector<uint8_t> b = {0, 0, 0x08, 3};
  PutBE32(&b, n);
  PutBE32(&b, h);
  PutBE32(&b, w);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t k = 0; k < h * w; ++k) b.push_back(uint8_t((i * 7 + k) % 256));
  return b;
}

// IDX labels: label i = i % classes.
inline std::vector<uint8_t> IdxLabels(uint32_t n, uint32_t classes) {
  std::vector<uint8_t> b = {0, 0, 0x08, 1};
  PutBE32(&b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(uint8_t(i % classes));
  return b;
}

// CIFAR-10 records: label (first + r) % 10, pixel k = (first + r + k) % 256.
inline std::vector<uint8_t> CifarRecords(int first, int count) {
  std::vector<uint8_t> b;
  for (int r = first; r < first + count; ++r) {
    b.push_back(uint8_t(r % 10));
    for (int k = 0; k < 3072; ++k) b.push_back(uint8_t((r + k) % 256));
  }
  return b;
}

// CIFAR-100 records: coarse label (3r + 1) % 20, fine label r % 100 (unrelated, so a reader
// that takes the wrong byte shows), pixel k = (r + k) % 256.
inline std::vector<uint8_t> Cifar100Records(int first, int count) {
  std::vector<uint8_t> b;
  for (int r = first; r < first + count; ++r) {
    b.push_back(uint8_t((3 * r + 1) % 20));
    b.push_back(uint8_t(r % 100));
    for (int k = 0; k < 3072; ++k) b.push_back(uint8_t((r + k) % 256));
  }
  return b;
}

}  // namespace testdata
}  // namespace shoal
