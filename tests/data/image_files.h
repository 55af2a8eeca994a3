// Image data for the tests, made at test time from Fashion-MNIST by make_image_data.py
// (python3-pil), and PIL's own decode and resize of a file to compare against.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace shoal {
namespace testdata {

inline std::string ImageScript() {
  const char* src = getenv("TEST_SRCDIR");
  const char* ws = getenv("TEST_WORKSPACE");
  return (src && ws ? std::string(src) + "/" + ws + "/" : std::string()) + "tests/data/make_image_data.py";
}

// Runs make_image_data.py with `args`; fails the test when it fails.
inline void MakeImages(const std::string& args) {
  const std::string cmd = "/usr/bin/python3 '" + ImageScript() + "' " + args;
  ASSERT_EQ(system(cmd.c_str()), 0) << cmd;
}

inline std::vector<uint8_t> ReadAll(const std::string& path) {
  std::vector<uint8_t> b;
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return b;
  uint8_t buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) b.insert(b.end(), buf, buf + n);
  fclose(f);
  return b;
}

}  // namespace testdata
}  // namespace shoal
