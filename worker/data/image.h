// Decoding (JPEG through TurboJPEG, PNG through libpng) and the geometry of the image
// transforms: torchvision's RandomResizedCrop and its evaluation resize + center crop, and
// a PIL-compatible antialiased bilinear resize of a box of the image, written as
// normalized float CHW. Every function is thread-safe (decoder handles are per thread).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/random.h"

namespace shoal {
namespace data {

// Interleaved 8-bit pixels, h rows of w * c bytes. A region of a larger image (a JPEG
// decoded only where a crop needs it) starts at (x0, y0) of a full_w x full_h image; a whole
// image has x0 = y0 = 0 and full_w = full_h = 0.
struct Image {
  int w = 0, h = 0, c = 0;
  std::vector<uint8_t> px;
  int x0 = 0, y0 = 0, full_w = 0, full_h = 0;
};

enum class ImageFormat { kUnknown, kJpeg, kPng };
// By content (magic bytes), not by file name: a PNG named .jpg still decodes.
ImageFormat DetectImageFormat(const uint8_t* data, size_t size);

// Width and height from the header only; throws InputError naming `name` when the bytes
// are no JPEG or PNG or the header is unreadable.
void ImageSize(const uint8_t* data, size_t size, const std::string& name, int* w, int* h);

// Decodes to `channels` (3: RGB, 1: luma, ITU-R 601 weights as PIL's convert("L") and
// JPEG's own Y). A JPEG is decoded at scale num/den (TurboJPEG's DCT-domain scaling: 1/8
// steps); a PNG ignores the scale. Throws InputError naming `name` for a corrupt or
// truncated image (a JPEG that ends early is an error, as in PIL, not a gray tail).
void DecodeImage(const uint8_t* data, size_t size, const std::string& name, int channels, Image* out, int scale_num = 1,
                 int scale_den = 1);

// The largest DCT downscaling (num/den, den 8) under which a box of box_w x box_h pixels
// of the full image still covers at least out_w x out_h pixels.
void JpegScaleFor(double box_w, double box_h, int out_w, int out_h, int* num, int* den);

// A box of the source image, in pixels of the full-size image (fractional edges allowed).
struct Box {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3, ten tries,
// then a center crop clamped to the ratio range), drawing from `rng`; integer box.
Box RandomResizedCropBox(int w, int h, Rng* rng);
// Evaluation: resize the shorter side to int(size / crop_fraction), then center-crop
// size x size (torchvision's Resize + CenterCrop), as one box of the source.
Box CenterCropBox(int w, int h, int size, double crop_fraction);

// Decodes only columns [x0, x1) and rows [y0, y1) of the JPEG at scale num/den (in pixels
// of the scaled image), and what libjpeg needs around them so they equal the whole decode's:
// rows above the region are entropy-decoded and skipped, rows below are never read, columns
// outside it are not transformed or converted. `out` is that region (x0/y0/full_w/full_h
// set). CMYK files are decoded whole. Errors as DecodeImage's: a file that ends early is an
// error even when the cut lies below the region (the end-of-image marker must be there), so
// skip_bad counts the same file bad whatever its crops.
void DecodeJpegRegion(const uint8_t* data, size_t size, const std::string& name, int channels, int scale_num,
                      int scale_den, int x0, int y0, int x1, int y1, Image* out);

// The columns [x0, x1) and rows [y0, y1) of a w x h image that ResizeBoxToCHW reads for
// `box` at out_w x out_h: the box and its filter's support, clamped to the image.
void ResizeFootprint(int w, int h, const Box& box, int out_w, int out_h, int* x0, int* y0, int* x1, int* y1);

// Resamples `box` of `img` (of its full image, when img is a region that holds every pixel
// ResizeFootprint names) to out_w x out_h with PIL's antialiased bilinear filter
// (Image.resize(..., BILINEAR, box=...)), mirrored when `flip`, and writes channel k as
// x * scale[k] + shift[k] (x in [0, 255]) into out[c][out_h][out_w].
void ResizeBoxToCHW(const Image& img, const Box& box, int out_w, int out_h, bool flip, const float* scale,
                    const float* shift, float* out);

}  // namespace data
}  // namespace shoal
