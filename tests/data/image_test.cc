// Decoding against PIL's decode of the same file (PNG exact; JPEG through the same
// libjpeg-turbo IDCT, within a level or two), the antialiased resize against PIL's resize of
// the same box, the geometry of the crops, and bad images: one error naming the file.
#include "worker/data/image.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "tests/data/image_files.h"
#include "tests/data/test_files.h"
#include "worker/data/webdataset.h"

namespace shoal {
namespace data {
namespace {

using testdata::MakeImages;
using testdata::ReadAll;
using testdata::TempDir;

Image Decode(const std::string& path, int channels, int num = 1, int den = 1) {
  std::vector<uint8_t> b = ReadAll(path);
  Image img;
  DecodeImage(b.data(), b.size(), path, channels, &img, num, den);
  return img;
}

// PIL's decode: width, height, then the pixels.
Image PilDecode(const TempDir& dir, const std::string& path, int channels) {
  const std::string out = dir / "pil.raw";
  MakeImages("decode '" + path + "' " + std::to_string(channels) + " '" + out + "'");
  std::vector<uint8_t> b = ReadAll(out);
  Image img;
  int32_t wh[2] = {0, 0};
  if (b.size() >= 8) memcpy(wh, b.data(), 8);
  img.w = wh[0];
  img.h = wh[1];
  img.c = channels;
  img.px.assign(b.begin() + 8, b.end());
  return img;
}

int MaxDiff(const Image& a, const Image& b) {
  EXPECT_EQ(a.w, b.w);
  EXPECT_EQ(a.h, b.h);
  EXPECT_EQ(a.px.size(), b.px.size());
  int m = 0;
  for (size_t i = 0; i < std::min(a.px.size(), b.px.size()); ++i) m = std::max(m, std::abs(a.px[i] - b.px[i]));
  return m;
}

TEST(ImageDecode, MatchesPil) {
  TempDir dir;
  MakeImages("photo '" + dir / "p.jpg" + "' 500 375 90");
  MakeImages("photo '" + dir / "p.png" + "' 123 77 90");
  MakeImages("folder '" + dir / "f" + "' 4 2");  // grayscale PNG (even index) and JPEG (odd)
  for (int c : {3, 1}) {
    EXPECT_EQ(MaxDiff(Decode(dir / "p.png", c), PilDecode(dir, dir / "p.png", c)), 0) << "png, channels " << c;
    // The same libjpeg-turbo (accurate IDCT, fancy upsampling) under PIL: at most rounding.
    EXPECT_LE(MaxDiff(Decode(dir / "p.jpg", c), PilDecode(dir, dir / "p.jpg", c)), 2) << "jpeg, channels " << c;
  }
  const std::string gray_png = dir / "f/train/9-boot/000000.png", gray_jpg = dir / "f/train/0-tshirt/000001.jpg";
  EXPECT_EQ(MaxDiff(Decode(gray_png, 1), PilDecode(dir, gray_png, 1)), 0);
  EXPECT_EQ(MaxDiff(Decode(gray_png, 3), PilDecode(dir, gray_png, 3)), 0);
  EXPECT_LE(MaxDiff(Decode(gray_jpg, 1), PilDecode(dir, gray_jpg, 1)), 1);
  EXPECT_LE(MaxDiff(Decode(gray_jpg, 3), PilDecode(dir, gray_jpg, 3)), 1);
}

TEST(ImageDecode, DctScalingShrinksTheJpeg) {
  TempDir dir;
  MakeImages("photo '" + dir / "p.jpg" + "' 500 375 90");
  Image half = Decode(dir / "p.jpg", 3, 1, 2), eighth = Decode(dir / "p.jpg", 3, 1, 8);
  EXPECT_EQ(half.w, 250);
  EXPECT_EQ(half.h, 188);
  EXPECT_EQ(eighth.w, 63);
  EXPECT_EQ(eighth.h, 47);
  int num, den;
  JpegScaleFor(500, 375, 224, 224, &num, &den);  // 224 / 375 = 0.6: 5/8 is the smallest that covers it
  EXPECT_EQ(num * 8, 5 * den);
  JpegScaleFor(500, 375, 28, 28, &num, &den);
  EXPECT_EQ(num * 8, den);
  JpegScaleFor(100, 100, 224, 224, &num, &den);  // smaller than the output: full size
  EXPECT_EQ(num, den);
}

TEST(ImageResize, MatchesPilBilinearWithBox) {
  TempDir dir;
  MakeImages("photo '" + dir / "p.png" + "' 200 150 90");
  Image img = Decode(dir / "p.png", 3);
  const float scale[3] = {1, 1, 1}, shift[3] = {0, 0, 0};
  struct Case {
    int w, h;
    Box box;
  };
  // Downscale (antialiased), upscale, fractional box, identity.
  for (const Case& k : {Case{56, 40, {0, 0, 200, 150}}, Case{64, 64, {10.5, 20.25, 60, 70}},
                        Case{30, 30, {33, 17, 160, 140}}, Case{200, 150, {0, 0, 200, 150}}}) {
    std::vector<float> out(size_t(3 * k.w * k.h));
    ResizeBoxToCHW(img, k.box, k.w, k.h, false, scale, shift, out.data());
    const std::string raw = dir / "r.raw";
    char nums[128];
    snprintf(nums, sizeof(nums), " %d %d %g %g %g %g ", k.w, k.h, k.box.x0, k.box.y0, k.box.x1, k.box.y1);
    MakeImages("resize '" + dir / "p.png" + "'" + nums + "'" + raw + "'");
    std::vector<uint8_t> pil = ReadAll(raw);
    ASSERT_EQ(pil.size(), out.size());
    int worst = 0;
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < k.w * k.h; ++i)
        worst = std::max(worst, int(std::fabs(out[size_t(c * k.w * k.h + i)] - pil[size_t(i * 3 + c)])));
    // PIL works in fixed point; this in float: a level apart at most.
    EXPECT_LE(worst, 1) << k.w << "x" << k.h;
  }
}

TEST(ImageResize, FlipMirrorsAndNormalizes) {
  Image img;
  img.w = 4;
  img.h = 1;
  img.c = 1;
  img.px = {0, 50, 100, 250};
  const float scale[1] = {2.0f / 255}, shift[1] = {-1};
  std::vector<float> out(4);
  ResizeBoxToCHW(img, {0, 0, 4, 1}, 4, 1, true, scale, shift, out.data());
  for (int x = 0; x < 4; ++x) EXPECT_FLOAT_EQ(out[size_t(x)], img.px[size_t(3 - x)] * 2.0f / 255 - 1);
}

TEST(ImageGeometry, CenterCropIsTorchvisionsResizeThenCrop) {
  // 500x375, 224: the shorter side becomes 256 (224 / 0.875), the longer int(256*500/375) = 341;
  // the crop starts at round((341 - 224) / 2) = 58 (59 by round-half-even of 58.5: 58), top 16.
  Box b = CenterCropBox(500, 375, 224, 0.875);
  const double s = 500.0 / 341;
  EXPECT_NEAR(b.x0, 58 * s, 1e-9);
  EXPECT_NEAR(b.x1, (58 + 224) * s, 1e-9);
  EXPECT_NEAR(b.y0, 16 * 375.0 / 256, 1e-9);
  EXPECT_NEAR(b.y1, 240 * 375.0 / 256, 1e-9);
  // crop_fraction 1 on a square image: the whole image.
  Box w = CenterCropBox(28, 28, 28, 1.0);
  EXPECT_EQ(w.x0, 0);
  EXPECT_EQ(w.y0, 0);
  EXPECT_EQ(w.x1, 28);
  EXPECT_EQ(w.y1, 28);
}

TEST(ImageGeometry, RandomResizedCropStaysInRangeAndRepeats) {
  int fallback = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    Rng a(seed), b(seed);
    Box x = RandomResizedCropBox(500, 375, &a), y = RandomResizedCropBox(500, 375, &b);
    ASSERT_EQ(x.x0, y.x0);
    ASSERT_EQ(x.y1, y.y1);
    const double w = x.x1 - x.x0, h = x.y1 - x.y0;
    ASSERT_GE(x.x0, 0);
    ASSERT_GE(x.y0, 0);
    ASSERT_LE(x.x1, 500);
    ASSERT_LE(x.y1, 375);
    ASSERT_EQ(w, std::floor(w));
    if (w == 500 && h == 375) {
      ++fallback;
      continue;
    }
    // Rounding moves area and ratio a little off the drawn values.
    EXPECT_GE(w * h, 0.08 * 500 * 375 * 0.9);
    EXPECT_GE(w / h, 0.75 * 0.9);
    EXPECT_LE(w / h, 4.0 / 3 * 1.1);
  }
  EXPECT_LT(fallback, 20);
  // A strip far outside the ratio range falls back to a centred crop of the ratio's limit.
  Rng r(1);
  Box s = RandomResizedCropBox(1000, 10, &r);
  EXPECT_LE(s.x1 - s.x0, 1000);
  EXPECT_GE(s.x0, 0);
}

TEST(ImageDecode, BadImagesNameTheFile) {
  TempDir dir;
  MakeImages("photo '" + dir / "p.jpg" + "' 64 48 90");
  MakeImages("photo '" + dir / "p.png" + "' 64 48 90");
  std::vector<uint8_t> jpg = ReadAll(dir / "p.jpg"), png = ReadAll(dir / "p.png");
  auto fails = [&](std::vector<uint8_t> b, const std::string& name, const std::string& want) {
    Image img;
    try {
      DecodeImage(b.data(), b.size(), name, 3, &img);
      ADD_FAILURE() << name << ": decoded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  fails(std::vector<uint8_t>(jpg.begin(), jpg.begin() + long(jpg.size() / 2)), "cut.jpg", "truncated");
  fails(std::vector<uint8_t>(png.begin(), png.begin() + long(png.size() / 2)), "cut.png", "PNG");
  std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  fails(text, "notes.jpg", "not an image");
  fails({}, "empty.png", "empty");
  std::vector<uint8_t> garbled = jpg;
  for (size_t i = 200; i < garbled.size() - 2; ++i) garbled[i] = uint8_t(i * 7);
  fails(garbled, "garbled.jpg", "JPEG");
  std::vector<uint8_t> crc = png;
  crc[40] ^= 0xff;  // inside IHDR or IDAT: a CRC error
  fails(crc, "crc.png", "PNG");
  // A header that claims 20000 x 20000 pixels is refused before anything is allocated.
  std::vector<uint8_t> huge = png;
  for (int k : {16, 20})
    huge[size_t(k)] = 0, huge[size_t(k + 1)] = 0, huge[size_t(k + 2)] = 0x4e, huge[size_t(k + 3)] = 0x20;
  const uLong sum = crc32(0, huge.data() + 12, 17);  // IHDR's type and data
  for (int k = 0; k < 4; ++k) huge[size_t(29 + k)] = uint8_t(sum >> (24 - 8 * k));
  fails(huge, "huge.png", "limit");
  // The thread's decoder is still good after all that (TurboJPEG leaves a handle broken
  // after a header it could not read).
  Image ok;
  DecodeImage(jpg.data(), jpg.size(), "p.jpg", 3, &ok);
  EXPECT_EQ(ok.w, 64);
  fails(std::vector<uint8_t>(jpg.begin(), jpg.begin() + 30), "head.jpg", "head.jpg");
  DecodeImage(jpg.data(), jpg.size(), "p.jpg", 3, &ok);
  EXPECT_EQ(ok.h, 48);
}

// Decoding only a crop's rows and columns (libjpeg's row skipping and column cropping) gives
// the whole decode's pixels there, at every DCT scale, in RGB and luma, for 4:2:0 and 4:4:4
// files and odd sizes; the resize of a region equals the resize of the whole image for
// RandomResizedCrop boxes; a file cut below the region is still an error.
TEST(ImageDecode, RegionDecodeEqualsTheWholeDecode) {
  TempDir dir;
  MakeImages("photo '" + dir / "a.jpg" + "' 500 375 90");
  MakeImages("photo '" + dir / "b.jpg" + "' 333 251 95");
  int checked = 0;
  for (const std::string name : {"a.jpg", "b.jpg"}) {
    const std::vector<uint8_t> bytes = ReadAll(dir / name);
    int w = 0, h = 0;
    ImageSize(bytes.data(), bytes.size(), name, &w, &h);
    Rng rng(7);
    for (int trial = 0; trial < 40; ++trial) {
      const int channels = trial % 2 ? 1 : 3;
      const Box box = RandomResizedCropBox(w, h, &rng);
      const int out = trial % 3 == 0 ? 64 : 224;
      int num = 1, den = 1;
      JpegScaleFor(box.x1 - box.x0, box.y1 - box.y0, out, out, &num, &den);
      Image whole, region;
      DecodeImage(bytes.data(), bytes.size(), name, channels, &whole, num, den);
      const double sx = double(whole.w) / w, sy = double(whole.h) / h;
      const Box scaled = {box.x0 * sx, box.y0 * sy, box.x1 * sx, box.y1 * sy};
      int x0, y0, x1, y1;
      ResizeFootprint(whole.w, whole.h, scaled, out, out, &x0, &y0, &x1, &y1);
      DecodeJpegRegion(bytes.data(), bytes.size(), name, channels, num, den, x0, y0, x1, y1, &region);
      ASSERT_EQ(region.full_w, whole.w);
      ASSERT_EQ(region.full_h, whole.h);
      ASSERT_LE(region.x0, x0);
      ASSERT_EQ(region.y0, y0);
      ASSERT_GE(region.x0 + region.w, x1);
      ASSERT_EQ(region.h, y1 - y0);
      // The footprint's pixels (the columns just outside it may differ: a cropped row's edge).
      const size_t C = size_t(channels), span = size_t(x1 - x0) * C;
      for (int y = 0; y < region.h; ++y)
        ASSERT_EQ(memcmp(&region.px[(size_t(y) * size_t(region.w) + size_t(x0 - region.x0)) * C],
                         &whole.px[(size_t(y + y0) * size_t(whole.w) + size_t(x0)) * C], span),
                  0)
            << name << " trial " << trial << " scale " << num << "/" << den << " row " << y + y0;
      const std::vector<float> scale(size_t(channels), 1.0f), shift(size_t(channels), 0.0f);
      std::vector<float> a(size_t(channels) * out * out), b(a.size());
      ResizeBoxToCHW(whole, scaled, out, out, trial % 4 == 1, scale.data(), shift.data(), a.data());
      ResizeBoxToCHW(region, scaled, out, out, trial % 4 == 1, scale.data(), shift.data(), b.data());
      ASSERT_EQ(a, b) << name << " trial " << trial;
      checked += region.w * region.h < whole.w * whole.h;
    }
  }
  EXPECT_GT(checked, 40);  // most crops decode less than the whole image

  // Cut: the rows kept decode, but the end-of-image marker is missing, as the whole decode says.
  std::vector<uint8_t> cut = ReadAll(dir / "a.jpg");
  cut.resize(cut.size() * 3 / 4);
  Image img;
  try {
    DecodeJpegRegion(cut.data(), cut.size(), "cut.jpg", 3, 1, 1, 0, 0, 100, 50, &img);
    ADD_FAILURE() << "decoded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.jpg: corrupt or truncated JPEG"), std::string::npos) << e.what();
  }
}

TEST(WebDatasetShards, BraceExpansion) {
  EXPECT_EQ(ExpandBraces("a-{000..002}.tar"), (std::vector<std::string>{"a-000.tar", "a-001.tar", "a-002.tar"}));
  EXPECT_EQ(ExpandBraces("{x,y}/s-{8..10}.tar"),
            (std::vector<std::string>{"x/s-8.tar", "x/s-9.tar", "x/s-10.tar", "y/s-8.tar", "y/s-9.tar", "y/s-10.tar"}));
  EXPECT_EQ(ExpandBraces("plain.tar"), (std::vector<std::string>{"plain.tar"}));
  EXPECT_THROW(ExpandBraces("a-{1..3.tar"), Error);
  EXPECT_THROW(ExpandBraces("a-{1..x}.tar"), Error);
  EXPECT_THROW(ExpandBraces("a-{0..99999999}.tar"), Error);
}

}  // namespace
}  // namespace data
}  // namespace shoal
