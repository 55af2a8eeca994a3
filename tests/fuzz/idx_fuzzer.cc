// Fuzzes the IDX reader (and the gzip inflater under it, chosen by magic bytes) on an
// images file and a labels file cut from one input:
//   u8 options, u32 images_len, images bytes, labels bytes (the rest)
// options: bit 0 reads through the prefix, else through the images file's path; bits 1-2
// pick num_classes (0, 1, 10, 255); bits 3-4 pick max_samples (0, 1, 2, 7).
#include <string>

#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/data/idx_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shoal::fuzz::Reader in{data, size};
  uint32_t opts = in.U8();
  size_t images_len = in.U32();
  const uint8_t* images = in.p;
  images_len = in.Take(images_len);
  const std::string prefix = shoal::fuzz::ScratchDir() + "/f";
  shoal::fuzz::WriteFile(prefix + "-images-idx3-ubyte", images, images_len);
  shoal::fuzz::WriteFile(prefix + "-labels-idx1-ubyte", in.p, in.n);
  shoal::data::DatasetOptions o;
  o.num_classes = (const int64_t[]){0, 1, 10, 255}[(opts >> 1) & 3];
  o.max_samples = (const int64_t[]){0, 1, 2, 7}[(opts >> 3) & 3];
  try {
    shoal::data::ReadIdx(opts & 1 ? prefix : prefix + "-images-idx3-ubyte", o);
  } catch (const shoal::Error&) {
  }
  return 0;
}
