// Replays a fuzz target's seed corpus through LLVMFuzzerTestOneInput, built by Bazel's
// compiler without libFuzzer: every seed stays a regression case in `bazel test`, and the
// targets' BUILD dependencies are the one list of production code tests/fuzz/build.sh
// compiles for the instrumented build.
// usage: NAME_corpus_test DIR...  (fails when no input is found, so it cannot pass empty)
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    DIR* d = opendir(argv[i]);
    if (!d) {
      std::fprintf(stderr, "replay: cannot open corpus directory %s\n", argv[i]);
      return 2;
    }
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') files.push_back(std::string(argv[i]) + "/" + e->d_name);
    closedir(d);
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "replay: no corpus inputs in the directories given\n");
    return 2;
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.eof() && in.fail()) {
      std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
      return 2;
    }
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    std::fprintf(stderr, "replay: %s (%zu bytes) ok\n", f.c_str(), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu inputs, no crash\n", files.size());
  return 0;
}
