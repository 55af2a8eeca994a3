// Helpers shared by the fuzz targets: a scratch directory per process and whole-file
// writes, so readers that take paths see the fuzzer's bytes as files.
#pragma once
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace shoal {
namespace fuzz {

// Removed at exit; /dev/shm when there is one, since every execution writes files.
inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    std::string t = std::string(base) + "/shoal-fuzz-XXXXXX";
    if (!mkdtemp(&t[0])) abort();
    static std::string rm = "rm -rf '" + t + "'";
    atexit([] { (void)!system(rm.c_str()); });
    return t;
  }();
  return dir;
}

inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
}

// Takes bytes off the front of the input; short reads yield what is left.
struct Reader {
  const uint8_t* p;
  size_t n;
  size_t Take(size_t want) {
    size_t k = want < n ? want : n;
    p += k;
    n -= k;
    return k;
  }
  uint32_t U8() { return n ? (--n, *p++) : 0; }
  // Little-endian; one statement per byte, since operands of | are unsequenced.
  uint32_t U16() {
    uint32_t lo = U8();
    return lo | (U8() << 8);
  }
  uint32_t U32() {
    uint32_t lo = U16();
    return lo | (U16() << 16);
  }
};

}  // namespace fuzz
}  // namespace shoal
