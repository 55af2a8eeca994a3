// Fuzzes the encoded-image path: JPEG and PNG decoding (header, DCT scaling, libpng's
// error longjmp), the crop boxes and the resize, and the webdataset tar scanner with the
// reads of what it indexed:
//   u8 options, bytes (the rest)
// options: bit 0: the bytes are an image (0) or a tar shard (1); bit 1: 1 or 3 channels;
// bits 2-4: the JPEG scale n/8 (0: 1/1); bit 5: RandomResizedCrop instead of center crop;
// bit 6: skip_bad for the shard; bit 7: a JPEG decoded only where the resize reads (the loader's
// libjpeg path).
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"
#include "worker/data/dataset.h"
#include "worker/data/image.h"
#include "worker/data/webdataset.h"

namespace {

void DecodeAndResize(const std::vector<uint8_t>& b, uint32_t opts) {
  using namespace shoal::data;
  const int channels = (opts & 2) ? 3 : 1;
  int w = 0, h = 0;
  ImageSize(b.data(), b.size(), "input", &w, &h);
  Rng rng(opts);
  const Box box = (opts & 32) ? RandomResizedCropBox(w, h, &rng) : CenterCropBox(w, h, 16, 0.875);
  const int n = int((opts >> 2) & 7);
  Image img;
  const int num = n ? n : 1, den = n ? 8 : 1;
  const float scale[3] = {1, 1, 1}, shift[3] = {0, 0, 0};
  std::vector<float> out(size_t(channels) * 16 * 16);
  if ((opts & 128) && DetectImageFormat(b.data(), b.size()) == ImageFormat::kJpeg) {
    const int fw = (w * num + den - 1) / den, fh = (h * num + den - 1) / den;
    const double sx = double(fw) / w, sy = double(fh) / h;
    const Box scaled = {box.x0 * sx, box.y0 * sy, box.x1 * sx, box.y1 * sy};
    int x0, y0, x1, y1;
    ResizeFootprint(fw, fh, scaled, 16, 16, &x0, &y0, &x1, &y1);
    DecodeJpegRegion(b.data(), b.size(), "input", channels, num, den, x0, y0, x1, y1, &img);
    ResizeBoxToCHW(img, scaled, 16, 16, opts & 1, scale, shift, out.data());
    return;
  }
  DecodeImage(b.data(), b.size(), "input", channels, &img, num, den);
  const double sx = double(img.w) / w, sy = double(img.h) / h;
  ResizeBoxToCHW(img, {box.x0 * sx, box.y0 * sy, box.x1 * sx, box.y1 * sy}, 16, 16, opts & 1, scale, shift, out.data());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shoal::fuzz::Reader in{data, size};
  const uint32_t opts = in.U8();
  std::vector<uint8_t> bytes(in.p, in.p + in.n);
  try {
    if (!(opts & 1)) {
      DecodeAndResize(bytes, opts);
      return 0;
    }
    const std::string path = shoal::fuzz::ScratchDir() + "/shard.tar";
    shoal::fuzz::WriteFile(path, in.p, in.n);
    shoal::data::DatasetOptions o;
    o.image_size = 16;
    o.skip_bad = opts & 64;
    auto ds = shoal::data::ReadWebDataset(path, o);
    for (int64_t i = 0; i < ds->size() && i < 3; ++i) {
      std::vector<uint8_t> b;
      ds->encoded().Read(i, &b);
      try {
        DecodeAndResize(b, opts);
      } catch (const shoal::Error&) {
      }
    }
  } catch (const shoal::Error&) {
  }
  return 0;
}
