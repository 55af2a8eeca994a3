// Fuzzes the CIFAR binary reader (and the gzip inflater under it) on one batch file:
//   u8 options, file bytes (the rest)
// options: bits 0-1 pick num_classes (0 = the layout's own, 1, 10, 255); bits 2-3 pick
// max_samples (0, 1, 2, 5); bits 4-5 the layout (0 CIFAR-10, 1 CIFAR-100 fine labels,
// 2 CIFAR-100 coarse labels, 3 CIFAR-10).
#include <string>

#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/data/cifar_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shoal::fuzz::Reader in{data, size};
  uint32_t opts = in.U8();
  const std::string path = shoal::fuzz::ScratchDir() + "/data_batch_1.bin";
  shoal::fuzz::WriteFile(path, in.p, in.n);
  shoal::data::DatasetOptions o;
  o.num_classes = (const int64_t[]){0, 1, 10, 255}[opts & 3];
  o.max_samples = (const int64_t[]){0, 1, 2, 5}[(opts >> 2) & 3];
  const uint32_t layout = (opts >> 4) & 3;
  o.cifar100_coarse = layout == 2;
  try {
    if (layout == 1 || layout == 2)
      shoal::data::ReadCifar100(path, o);
    else
      shoal::data::ReadCifar(path, o);
  } catch (const shoal::Error&) {
  }
  return 0;
}
