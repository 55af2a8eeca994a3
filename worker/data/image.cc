#include "worker/data/image.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <tuple>
// After <cstdio>: jpeglib.h uses FILE.
#include <jerror.h>
#include <jpeglib.h>

#include "common/error.h"

namespace shoal {
namespace data {

namespace {

// A decoded image larger than this is refused before its buffer is allocated: a header
// may claim 65535 x 65535 pixels in a few bytes.
constexpr int64_t kMaxPixels = int64_t(1) << 27;

void CheckPixels(const std::string& name, int64_t w, int64_t h) {
  if (w <= 0 || h <= 0)
    throw InputError(name + ": image has no pixels (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  if (w * h > kMaxPixels)
    throw InputError(name + ": image of " + std::to_string(w) + "x" + std::to_string(h) +
                     " pixels is larger than the limit of 2^27 pixels");
}

// One TurboJPEG handle per thread: creating one costs more than decoding a small image.
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
};
TjHandle& ThreadHandle() {
  thread_local TjHandle t;
  return t;
}
tjhandle Decompressor() {
  TjHandle& t = ThreadHandle();
  if (!t.h) t.h = tjInitDecompress();
  if (!t.h) throw Error("TurboJPEG: cannot create a decompressor");
  return t.h;
}
// TurboJPEG 2.1 leaves a handle mid-header after tjDecompressHeader3 fails (it does not
// abort the decompressor), and the next file read with it fails too ("Unsupported marker
// type"): the error message is taken, then the handle replaced.
std::string FailedWith(tjhandle tj) {
  std::string msg = tjGetErrorStr2(tj);
  TjHandle& t = ThreadHandle();
  if (t.h == tj) {
    tjDestroy(t.h);
    t.h = nullptr;
  }
  return msg;
}

uint32_t BE32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

// PIL's convert("L"): L = R * 299/1000 + G * 587/1000 + B * 114/1000, in 16-bit fixed point.
inline uint8_t Luma(int r, int g, int b) { return uint8_t((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16); }

void DecodeJpeg(const uint8_t* data, size_t size, const std::string& name, int channels, Image* out, int num, int den) {
  tjhandle tj = Decompressor();
  int w = 0, h = 0, subsamp = 0, cs = 0;
  if (tjDecompressHeader3(tj, data, (unsigned long)size, &w, &h, &subsamp, &cs) != 0)
    throw InputError(name + ": not a readable JPEG: " + FailedWith(tj));
  tjscalingfactor sf = {num, den};
  const int sw = TJSCALED(w, sf), sh = TJSCALED(h, sf);
  CheckPixels(name, sw, sh);
  const bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
  // TurboJPEG converts no CMYK to RGB itself: decode CMYK and convert below. Grayscale from
  // a color JPEG is PIL's convert("L") of the RGB (as torchvision's Grayscale), not the Y
  // plane, which differs by up to 14 levels at chroma edges of subsampled files.
  const bool to_luma = channels == 1 && cs != TJCS_GRAY;
  const int pf = cmyk ? TJPF_CMYK : to_luma ? TJPF_RGB : channels == 1 ? TJPF_GRAY : TJPF_RGB;
  const int ps = tjPixelSize[pf];
  // Straight into the caller's buffer when no conversion follows; a buffer that only grows
  // (per thread) otherwise: a fresh one per image costs a zero fill and its page faults.
  const bool direct = !cmyk && !to_luma;
  thread_local std::vector<uint8_t> scratch;
  std::vector<uint8_t>& buf = direct ? out->px : scratch;
  const size_t bytes = size_t(sw) * size_t(sh) * size_t(ps);
  if (buf.size() < bytes) buf.resize(bytes);
  if (tjDecompress2(tj, data, (unsigned long)size, buf.data(), sw, sw * ps, sh, pf, 0) != 0) {
    const bool warning = tjGetErrorCode(tj) == TJERR_WARNING;
    const std::string msg = FailedWith(tj);
    // Warnings (extraneous bytes before a marker, common in real photo collections) leave
    // a whole image, as PIL accepts them; a file that ends early leaves a gray tail, an error.
    if (!warning || msg.find("Premature end") != std::string::npos)
      throw InputError(name + ": corrupt or truncated JPEG: " + msg);
  }
  out->w = sw;
  out->h = sh;
  out->c = channels;
  if (direct) {
    out->px.resize(bytes);  // shrinks only: no fill
    return;
  }
  if (!cmyk) {
    out->px.resize(size_t(sw) * size_t(sh));
    for (size_t i = 0, n = out->px.size(); i < n; ++i) out->px[i] = Luma(buf[i * 3], buf[i * 3 + 1], buf[i * 3 + 2]);
    return;
  }
  // Adobe's inverted CMYK, as libjpeg hands it over: R = C * K / 255 and so on.
  out->px.resize(size_t(sw) * size_t(sh) * size_t(channels));
  for (size_t i = 0, n = size_t(sw) * size_t(sh); i < n; ++i) {
    const int k = buf[i * 4 + 3];
    const int r = buf[i * 4] * k / 255, g = buf[i * 4 + 1] * k / 255, b = buf[i * 4 + 2] * k / 255;
    if (channels == 1) {
      out->px[i] = Luma(r, g, b);
    } else {
      out->px[i * 3] = uint8_t(r);
      out->px[i * 3 + 1] = uint8_t(g);
      out->px[i * 3 + 2] = uint8_t(b);
    }
  }
}

// libjpeg's errors longjmp back to the decode function (its default exits the process).
struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
  bool premature;
};
void JpegErrorExit(j_common_ptr c) {
  JpegErr* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->msg);
  longjmp(e->jb, 1);
}
// Warnings (extraneous bytes before a marker) are accepted as TurboJPEG's path accepts them;
// a file that ends early is not.
void JpegMessage(j_common_ptr c, int level) {
  if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) reinterpret_cast<JpegErr*>(c->err)->premature = true;
}

struct RegionOut {
  bool cmyk = false, no_eoi = false;
  int full_w = 0, full_h = 0, x0 = 0, w = 0, comps = 0;
};

// The setjmp frame holds no object with a destructor: libjpeg's longjmp would skip it.
bool DecodeRegionRows(jpeg_decompress_struct* ci, JpegErr* err, const uint8_t* data, size_t size, int channels, int num,
                      int den, int x0, int y0, int x1, int y1, std::vector<uint8_t>* buf, RegionOut* r) {
  if (setjmp(err->jb)) return false;
  jpeg_mem_src(ci, data, (unsigned long)size);
  jpeg_read_header(ci, TRUE);
  if (ci->jpeg_color_space == JCS_CMYK || ci->jpeg_color_space == JCS_YCCK) {
    r->cmyk = true;
    return true;
  }
  // Rows below the region are never decoded, so a cut there would go unseen: the scan data
  // must be followed by the end-of-image marker (FF D9 cannot occur inside entropy-coded
  // data, where FF is always followed by 00 or a restart marker).
  const uint8_t* scan = ci->src->next_input_byte;
  const uint8_t* end = data + size;
  bool eoi = size >= 2 && end[-2] == 0xFF && end[-1] == 0xD9;
  for (const uint8_t* p = scan; !eoi && p + 1 < end; ++p) {
    p = static_cast<const uint8_t*>(memchr(p, 0xFF, size_t(end - p) - 1));
    if (!p) break;
    eoi = p[1] == 0xD9;
  }
  if (!eoi) {
    r->no_eoi = true;
    return true;
  }
  ci->scale_num = unsigned(num);
  ci->scale_denom = unsigned(den);
  ci->out_color_space = channels == 1 && ci->jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(ci);
  r->full_w = int(ci->output_width);
  r->full_h = int(ci->output_height);
  x1 = std::min(x1, r->full_w);
  y1 = std::min(y1, r->full_h);
  // Fancy upsampling takes a cropped row's first column as the image's edge (its chroma
  // without the left neighbour): one column more each side keeps the region's pixels the
  // whole decode's. libjpeg widens the crop to whole iMCUs from there.
  const int cx0 = std::max(0, x0 - 1), cx1 = std::min(r->full_w, x1 + 1);
  JDIMENSION xo = JDIMENSION(cx0), cw = JDIMENSION(cx1 - cx0);
  if (cx0 > 0 || cx1 < r->full_w) jpeg_crop_scanline(ci, &xo, &cw);
  r->x0 = int(xo);
  r->w = int(cw);
  r->comps = ci->output_components;
  const size_t stride = size_t(cw) * size_t(r->comps);
  if (buf->size() < stride * size_t(y1 - y0)) buf->resize(stride * size_t(y1 - y0));
  if (y0 > 0) jpeg_skip_scanlines(ci, JDIMENSION(y0));
  while (int(ci->output_scanline) < y1) {
    JSAMPROW row = buf->data() + size_t(int(ci->output_scanline) - y0) * stride;
    jpeg_read_scanlines(ci, &row, 1);
  }
  jpeg_abort_decompress(ci);
  return true;
}

struct PngSource {
  const uint8_t* data;
  size_t size, off;
  char error[256];
};

void PngReadFn(png_structp png, png_bytep out, png_size_t len) {
  auto* s = static_cast<PngSource*>(png_get_io_ptr(png));
  if (s->size - s->off < len) png_error(png, "the file ends early");
  memcpy(out, s->data + s->off, len);
  s->off += len;
}
void PngErrorFn(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngSource*>(png_get_error_ptr(png));
  snprintf(s->error, sizeof(s->error), "%s", msg);
  png_longjmp(png, 1);
}
void PngWarnFn(png_structp, png_const_charp) {}

// The setjmp frame holds no object with a destructor: libpng's longjmp would skip it.
// Returns false with src->error set on a libpng error.
bool PngDecodeInto(png_structp png, png_infop info, PngSource* src, int channels, Image* out,
                   std::vector<png_bytep>* rows, bool* color, int* w, int* h) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_read_fn(png, src, PngReadFn);
  png_read_info(png, info);
  *w = int(png_get_image_width(png, info));
  *h = int(png_get_image_height(png, info));
  if (int64_t(*w) * int64_t(*h) > kMaxPixels || *w <= 0 || *h <= 0) return true;  // the caller refuses it
  const int depth = png_get_bit_depth(png, info), type = png_get_color_type(png, info);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);
  png_set_strip_alpha(png);  // as PIL's convert("RGB"): the alpha is dropped, not composited
  *color = (type & PNG_COLOR_MASK_COLOR) != 0;
  if (!*color && channels == 3) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  const int got = *color ? 3 : channels;
  if (rowbytes != size_t(*w) * size_t(got)) png_error(png, "unexpected row size after conversion");
  out->px.resize(rowbytes * size_t(*h));
  rows->resize(size_t(*h));
  for (int y = 0; y < *h; ++y) (*rows)[size_t(y)] = out->px.data() + size_t(y) * rowbytes;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  return true;
}

void DecodePng(const uint8_t* data, size_t size, const std::string& name, int channels, Image* out) {
  PngSource src{data, size, 0, {0}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, PngErrorFn, PngWarnFn);
  if (!png) throw Error("libpng: cannot create a reader");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw Error("libpng: cannot create a reader");
  }
  std::vector<png_bytep> rows;
  bool color = false;
  int w = 0, h = 0;
  const bool ok = PngDecodeInto(png, info, &src, channels, out, &rows, &color, &w, &h);
  png_destroy_read_struct(&png, &info, nullptr);
  if (!ok) throw InputError(name + ": corrupt or truncated PNG: " + src.error);
  CheckPixels(name, w, h);
  out->w = w;
  out->h = h;
  out->c = channels;
  if (color && channels == 1) {
    for (size_t i = 0, n = size_t(w) * size_t(h); i < n; ++i)
      out->px[i] = Luma(out->px[i * 3], out->px[i * 3 + 1], out->px[i * 3 + 2]);
    out->px.resize(size_t(w) * size_t(h));
  }
}

struct Coeffs {
  std::vector<int> lo, n;  // first source pixel and tap count of each output pixel
  std::vector<float> w;    // k weights per output pixel
  int k = 0;
};

// PIL's precompute_coeffs for the bilinear (triangle) filter: the support widens with the
// downscale factor, which is what makes the resize antialiased.
void Precompute(int in_size, double in0, double in1, int out_size, Coeffs* c) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;
  const double ss = 1.0 / filterscale;
  c->k = int(std::ceil(support)) * 2 + 1;
  c->lo.assign(size_t(out_size), 0);
  c->n.assign(size_t(out_size), 0);
  c->w.assign(size_t(out_size) * size_t(c->k), 0.0f);
  for (int i = 0; i < out_size; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int xmin = std::max(int(center - support + 0.5), 0);
    int xmax = std::min(int(center + support + 0.5), in_size) - xmin;
    xmax = std::min(std::max(xmax, 0), c->k);
    double total = 0;
    float* ww = &c->w[size_t(i) * size_t(c->k)];
    for (int x = 0; x < xmax; ++x) {
      const double t = std::fabs((x + xmin - center + 0.5) * ss);
      const double v = t < 1.0 ? 1.0 - t : 0.0;
      ww[x] = float(v);
      total += v;
    }
    if (total > 0)
      for (int x = 0; x < xmax; ++x) ww[x] = float(ww[x] / total);
    if (xmax == 0) {  // a box edge past the image: take the nearest pixel
      xmin = std::min(std::max(int(center), 0), in_size - 1);
      xmax = 1;
      ww[0] = 1.0f;
    }
    c->lo[size_t(i)] = xmin;
    c->n[size_t(i)] = xmax;
  }
}

// Round half to even by the 1.5 * 2^23 trick (exact for |v| < 2^22, which every sum of
// byte-weighted taps is), then clamp to a byte: branch-free, unlike nearbyint + min/max.
constexpr float kRound = 12582912.0f;
inline float RoundByte(float v) {
  v = (v + kRound) - kRound;
  v = v < 0.0f ? 0.0f : v;
  return v > 255.0f ? 255.0f : v;
}

// Four floats as one SSE (or NEON) register, through GCC's and clang's vector extension.
typedef float F4 __attribute__((vector_size(16)));
inline F4 Load4(const float* p) {
  F4 v;
  memcpy(&v, p, sizeof(v));
  return v;
}
inline void Store4(float* p, F4 v) { memcpy(p, &v, sizeof(v)); }

template <int C>
void HorizontalPass(const Image& img, const Coeffs& cx, int y_first, int rows, int out_w, float* tmp) {
  if (C == 3) {  // one pixel's R, G, B (and a spare lane) per vector
    const F4 round = {kRound, kRound, kRound, kRound}, zero = {0, 0, 0, 0}, top = {255, 255, 255, 255};
    for (int y = 0; y < rows; ++y) {
      const uint8_t* src = img.px.data() + size_t(y + y_first) * size_t(img.w) * 3;
      float* t = tmp + size_t(y) * size_t(out_w) * 3;
      for (int x = 0; x < out_w; ++x) {
        const float* w = &cx.w[size_t(x) * size_t(cx.k)];
        const uint8_t* s = src + size_t(cx.lo[size_t(x)]) * 3;
        F4 acc = zero;
        for (int k = 0, n = cx.n[size_t(x)]; k < n; ++k, s += 3) {
          const F4 px = {float(s[0]), float(s[1]), float(s[2]), 0.0f};
          const F4 wv = {w[k], w[k], w[k], w[k]};
          acc += wv * px;
        }
        acc = (acc + round) - round;
        acc = acc < zero ? zero : acc;
        acc = acc > top ? top : acc;
        t[x * 3] = acc[0];
        t[x * 3 + 1] = acc[1];
        t[x * 3 + 2] = acc[2];
      }
    }
    return;
  }
  for (int y = 0; y < rows; ++y) {
    const uint8_t* src = img.px.data() + size_t(y + y_first) * size_t(img.w) * C;
    float* t = tmp + size_t(y) * size_t(out_w) * C;
    for (int x = 0; x < out_w; ++x) {
      const float* w = &cx.w[size_t(x) * size_t(cx.k)];
      const uint8_t* s = src + size_t(cx.lo[size_t(x)]) * C;
      float acc[C] = {};
      for (int k = 0, n = cx.n[size_t(x)]; k < n; ++k) {
        const float wk = w[k];
        for (int c = 0; c < C; ++c) acc[c] += wk * float(s[k * C + c]);
      }
      for (int c = 0; c < C; ++c) t[x * C + c] = RoundByte(acc[c]);
    }
  }
}

}  // namespace

ImageFormat DetectImageFormat(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && memcmp(d, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

void ImageSize(const uint8_t* data, size_t size, const std::string& name, int* w, int* h) {
  switch (DetectImageFormat(data, size)) {
    case ImageFormat::kJpeg: {
      int subsamp = 0, cs = 0;
      tjhandle tj = Decompressor();
      if (tjDecompressHeader3(tj, data, (unsigned long)size, w, h, &subsamp, &cs) != 0)
        throw InputError(name + ": not a readable JPEG: " + FailedWith(tj));
      break;
    }
    case ImageFormat::kPng:
      if (size < 24 || memcmp(data + 12, "IHDR", 4) != 0) throw InputError(name + ": corrupt PNG: no IHDR header");
      *w = int(std::min<uint32_t>(BE32(data + 16), 1u << 30));
      *h = int(std::min<uint32_t>(BE32(data + 20), 1u << 30));
      break;
    default:
      throw InputError(name + ": not an image (neither JPEG nor PNG by its first bytes" +
                       std::string(size == 0 ? "; the file is empty" : "") + ")");
  }
  CheckPixels(name, *w, *h);
}

void DecodeImage(const uint8_t* data, size_t size, const std::string& name, int channels, Image* out, int scale_num,
                 int scale_den) {
  if (channels != 1 && channels != 3)
    throw Error(name + ": can decode to 1 or 3 channels, not " + std::to_string(channels));
  out->x0 = out->y0 = out->full_w = out->full_h = 0;  // a whole image
  switch (DetectImageFormat(data, size)) {
    case ImageFormat::kJpeg:
      DecodeJpeg(data, size, name, channels, out, scale_num, scale_den);
      return;
    case ImageFormat::kPng:
      DecodePng(data, size, name, channels, out);
      return;
    default: {
      int w, h;
      ImageSize(data, size, name, &w, &h);  // throws the "not an image" error
    }
  }
}

void DecodeJpegRegion(const uint8_t* data, size_t size, const std::string& name, int channels, int scale_num,
                      int scale_den, int x0, int y0, int x1, int y1, Image* out) {
  if (channels != 1 && channels != 3)
    throw Error(name + ": can decode to 1 or 3 channels, not " + std::to_string(channels));
  if (DetectImageFormat(data, size) != ImageFormat::kJpeg) throw InputError(name + ": not a JPEG");
  int w = 0, h = 0;
  ImageSize(data, size, name, &w, &h);
  const int fw = (w * scale_num + scale_den - 1) / scale_den, fh = (h * scale_num + scale_den - 1) / scale_den;
  CheckPixels(name, fw, fh);
  x0 = std::max(0, x0);
  y0 = std::max(0, y0);
  x1 = std::min(x1, fw);
  y1 = std::min(y1, fh);
  if (x0 >= x1 || y0 >= y1) throw Error(name + ": empty region to decode");
  jpeg_decompress_struct ci;
  JpegErr err;
  ci.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = JpegErrorExit;
  err.mgr.emit_message = JpegMessage;
  err.premature = false;
  err.msg[0] = 0;
  jpeg_create_decompress(&ci);
  const bool to_luma = channels == 1;  // from RGB, unless the file is gray (then it is the gray plane)
  thread_local std::vector<uint8_t> scratch;
  RegionOut r;
  const bool ok = DecodeRegionRows(&ci, &err, data, size, channels, scale_num, scale_den, x0, y0, x1, y1,
                                   to_luma ? &scratch : &out->px, &r);
  jpeg_destroy_decompress(&ci);
  if (!ok) throw InputError(name + ": corrupt or truncated JPEG: " + err.msg);
  if (r.no_eoi) throw InputError(name + ": corrupt or truncated JPEG: no end-of-image marker after the image data");
  if (err.premature) throw InputError(name + ": corrupt or truncated JPEG: Premature end of JPEG file");
  if (r.cmyk) {  // TurboJPEG's path converts CMYK; these are rare
    DecodeJpeg(data, size, name, channels, out, scale_num, scale_den);
    out->x0 = out->y0 = out->full_w = out->full_h = 0;
    return;
  }
  const size_t n = size_t(r.w) * size_t(y1 - y0);
  if (to_luma && r.comps == 3) {
    out->px.resize(n);
    for (size_t i = 0; i < n; ++i) out->px[i] = Luma(scratch[i * 3], scratch[i * 3 + 1], scratch[i * 3 + 2]);
  } else if (to_luma) {
    out->px.assign(scratch.begin(), scratch.begin() + std::ptrdiff_t(n));
  } else {
    out->px.resize(n * 3);
  }
  out->w = r.w;
  out->h = y1 - y0;
  out->c = channels;
  out->x0 = r.x0;
  out->y0 = y0;
  out->full_w = r.full_w;
  out->full_h = r.full_h;
}

void ResizeFootprint(int w, int h, const Box& box, int out_w, int out_h, int* x0, int* y0, int* x1, int* y1) {
  Coeffs c;
  for (int axis = 0; axis < 2; ++axis) {
    if (axis == 0)
      Precompute(w, box.x0, box.x1, out_w, &c);
    else
      Precompute(h, box.y0, box.y1, out_h, &c);
    int lo = INT32_MAX, hi = 0;
    for (size_t i = 0; i < c.lo.size(); ++i) {
      lo = std::min(lo, c.lo[i]);
      hi = std::max(hi, c.lo[i] + c.n[i]);
    }
    *(axis == 0 ? x0 : y0) = lo;
    *(axis == 0 ? x1 : y1) = hi;
  }
}

void JpegScaleFor(double box_w, double box_h, int out_w, int out_h, int* num, int* den) {
  // TurboJPEG's DCT scaling factors below 1 are n/8 for n = 1..7 (it lists more, all above 1).
  *num = 1;
  *den = 1;
  for (int n = 1; n < 8; ++n)
    if (box_w * n / 8.0 >= out_w && box_h * n / 8.0 >= out_h) {
      *num = n;
      *den = 8;
      if (n % 2 == 0) *num = n / 2, *den = 4;
      if (n % 4 == 0) *num = n / 4, *den = 2;
      return;
    }
}

Box RandomResizedCropBox(int w, int h, Rng* rng) {
  const double area = double(w) * double(h);
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (0.08 + (1.0 - 0.08) * rng->Uniform());
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * rng->Uniform());
    const int cw = int(std::nearbyint(std::sqrt(target * aspect)));
    const int ch = int(std::nearbyint(std::sqrt(target / aspect)));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
      const int y = int(rng->Below(uint64_t(h - ch + 1)));
      const int x = int(rng->Below(uint64_t(w - cw + 1)));
      return {double(x), double(y), double(x + cw), double(y + ch)};
    }
  }
  // Fallback: the whole image, cut to the ratio range, centred.
  int cw = w, ch = h;
  const double ratio = double(w) / double(h);
  if (ratio < 3.0 / 4.0)
    ch = std::min(h, int(std::nearbyint(w / (3.0 / 4.0))));
  else if (ratio > 4.0 / 3.0)
    cw = std::min(w, int(std::nearbyint(h * (4.0 / 3.0))));
  const int x = (w - cw) / 2, y = (h - ch) / 2;
  return {double(x), double(y), double(x + cw), double(y + ch)};
}

Box CenterCropBox(int w, int h, int size, double crop_fraction) {
  // torchvision's Resize(int): the shorter side becomes r, the longer int(r * long / short).
  const int r = std::max(size, int(std::floor(size / crop_fraction + 1e-9)));
  int rw, rh;
  if (w <= h) {
    rw = r;
    rh = std::max(1, int(int64_t(r) * h / w));
  } else {
    rh = r;
    rw = std::max(1, int(int64_t(r) * w / h));
  }
  // CenterCrop: offsets rounded as torchvision does; the crop of the resized image is the
  // same pixels as this box resampled at the resized image's scale.
  const int left = int(std::nearbyint((rw - size) / 2.0)), top = int(std::nearbyint((rh - size) / 2.0));
  const double sx = double(w) / rw, sy = double(h) / rh;
  return {left * sx, top * sy, (left + size) * sx, (top + size) * sy};
}

void ResizeBoxToCHW(const Image& img, const Box& box, int out_w, int out_h, bool flip, const float* scale,
                    const float* shift, float* out) {
  const int C = img.c;
  thread_local Coeffs cx, cy;
  // A region: the filter is the full image's (the same taps and weights), its taps moved
  // into the region's pixels.
  Precompute(img.full_w > 0 ? img.full_w : img.w, box.x0, box.x1, out_w, &cx);
  Precompute(img.full_h > 0 ? img.full_h : img.h, box.y0, box.y1, out_h, &cy);
  if (img.x0 != 0 || img.y0 != 0 || img.full_w > 0) {
    for (auto [c, o, n] : {std::make_tuple(&cx, img.x0, img.w), std::make_tuple(&cy, img.y0, img.h)})
      for (size_t i = 0; i < c->lo.size(); ++i) {
        c->lo[i] -= o;
        SHOAL_CHECK(c->lo[i] >= 0 && c->lo[i] + c->n[i] <= n, "ResizeBoxToCHW: the region lacks pixels the box needs");
      }
  }
  int y_first = img.h, y_last = 0;
  for (int y = 0; y < out_h; ++y) {
    y_first = std::min(y_first, cy.lo[size_t(y)]);
    y_last = std::max(y_last, cy.lo[size_t(y)] + cy.n[size_t(y)]);
  }
  const int rows = y_last - y_first;
  // Horizontal pass over the rows the vertical pass reads, rounded to bytes as PIL does.
  thread_local std::vector<float> tmp, acc;
  const size_t row = size_t(out_w) * size_t(C);
  tmp.resize(size_t(rows) * row);
  if (C == 3)
    HorizontalPass<3>(img, cx, y_first, rows, out_w, tmp.data());
  else
    HorizontalPass<1>(img, cx, y_first, rows, out_w, tmp.data());
  // Vertical pass a whole row at a time: contiguous multiply-adds the compiler vectorizes.
  acc.resize(row);
  const size_t plane = size_t(out_w) * size_t(out_h);
  for (int y = 0; y < out_h; ++y) {
    const float* w = &cy.w[size_t(y) * size_t(cy.k)];
    const int lo = cy.lo[size_t(y)] - y_first, n = cy.n[size_t(y)];
    float* a = acc.data();
    std::fill(a, a + row, 0.0f);
    const size_t row4 = row / 4 * 4;
    for (int k = 0; k < n; ++k) {
      const float wk = w[k];
      const float* t = tmp.data() + size_t(lo + k) * row;
      const F4 wv = {wk, wk, wk, wk};
      for (size_t i = 0; i < row4; i += 4) Store4(a + i, Load4(a + i) + wv * Load4(t + i));
      for (size_t i = row4; i < row; ++i) a[i] += wk * t[i];
    }
    const F4 round = {kRound, kRound, kRound, kRound}, zero = {0, 0, 0, 0}, top = {255, 255, 255, 255};
    for (size_t i = 0; i < row4; i += 4) {
      F4 v = (Load4(a + i) + round) - round;
      v = v < zero ? zero : v;
      Store4(a + i, v > top ? top : v);
    }
    for (size_t i = row4; i < row; ++i) a[i] = RoundByte(a[i]);
    for (int c = 0; c < C; ++c) {
      float* o = out + size_t(c) * plane + size_t(y) * size_t(out_w);
      const float sc = scale[c], sh = shift[c];
      if (flip)
        for (int x = 0; x < out_w; ++x) o[out_w - 1 - x] = a[size_t(x * C + c)] * sc + sh;
      else
        for (int x = 0; x < out_w; ++x) o[x] = a[size_t(x * C + c)] * sc + sh;
    }
  }
}

}  // namespace data
}  // namespace shoal
