#include "tools/launcher/plot.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>

#include "common/error.h"

namespace shoal {
namespace {

struct Image {
  int w, h;
  std::vector<uint8_t> rgb;
  Image(int w_, int h_) : w(w_), h(h_), rgb(size_t(w_) * h_ * 3, 255) {}
  void Set(int x, int y, uint32_t c) {
    if (x < 0 || y < 0 || x >= w || y >= h) return;
    uint8_t* p = &rgb[(size_t(y) * w + x) * 3];
    p[0] = uint8_t(c >> 16);
    p[1] = uint8_t(c >> 8);
    p[2] = uint8_t(c);
  }
  void Line(int x0, int y0, int x1, int y1, uint32_t c, int thick = 1) {
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    while (true) {
      for (int t = 0; t < thick; ++t) {
        Set(x0, y0 + t, c);
        Set(x0 + t, y0, c);
      }
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
};

// 5x7 glyphs, one byte per row (low 5 bits), for the characters labels use.
const std::map<char, std::vector<uint8_t>>& Font() {
  static const std::map<char, std::vector<uint8_t>> f = {
      {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},    {'2', {14, 17, 1, 2, 4, 8, 31}},
      {'3', {31, 2, 4, 2, 1, 17, 14}},     {'4', {2, 6, 10, 18, 31, 2, 2}},   {'5', {31, 16, 30, 1, 1, 17, 14}},
      {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},     {'8', {14, 17, 17, 14, 17, 17, 14}},
      {'9', {14, 17, 17, 15, 1, 2, 12}},   {'.', {0, 0, 0, 0, 0, 12, 12}},    {'-', {0, 0, 0, 31, 0, 0, 0}},
      {' ', {0, 0, 0, 0, 0, 0, 0}},        {'a', {0, 0, 14, 1, 15, 17, 15}},  {'c', {0, 0, 14, 16, 16, 17, 14}},
      {'e', {0, 0, 14, 17, 31, 16, 14}},   {'l', {12, 4, 4, 4, 4, 4, 14}},    {'o', {0, 0, 14, 17, 17, 17, 14}},
      {'r', {0, 0, 22, 25, 16, 16, 16}},   {'s', {0, 0, 15, 16, 14, 1, 30}},  {'t', {8, 8, 28, 8, 8, 9, 6}},
      {'u', {0, 0, 17, 17, 17, 19, 13}},   {'y', {0, 0, 17, 17, 15, 1, 14}},  {'w', {0, 0, 17, 17, 21, 21, 10}},
      {'i', {4, 0, 12, 4, 4, 4, 14}},      {'m', {0, 0, 26, 21, 21, 17, 17}}, {'n', {0, 0, 22, 25, 17, 17, 17}},
      {'(', {2, 4, 8, 8, 8, 4, 2}},        {')', {8, 4, 2, 2, 2, 4, 8}},      {'_', {0, 0, 0, 0, 0, 0, 31}},
  };
  return f;
}

void Text(Image& img, int x, int y, const std::string& s, uint32_t c) {
  for (char ch : s) {
    auto it = Font().find(ch);
    if (it != Font().end())
      for (int r = 0; r < 7; ++r)
        for (int b = 0; b < 5; ++b)
          if (it->second[r] & (16 >> b)) img.Set(x + b, y + r, c);
    x += 6;
  }
}

std::string Num(double v) {
  char b[32];
  if (std::fabs(v) >= 100 || v == std::floor(v))
    snprintf(b, sizeof b, "%.0f", v);
  else
    snprintf(b, sizeof b, "%.3g", v);
  return b;
}

void Panel(Image& img, int x0, int y0, int pw, int ph, const PlotSeries& s) {
  const uint32_t kAxis = 0x333333, kGrid = 0xdddddd, kLine = 0x1f77b4;
  Text(img, x0 + pw / 2 - int(s.title.size()) * 3, y0 - 14, s.title, 0x000000);
  int L = x0 + 40, R = x0 + pw - 10, T = y0, B = y0 + ph - 25;
  double tmin = 0, tmax = 1, vmin = 0, vmax = 1;
  bool any = false;
  for (auto& [t, v] : s.points) {
    if (!std::isfinite(v)) continue;
    if (!any) {
      tmax = t;
      vmin = vmax = v;
      any = true;
    }
    tmax = std::max(tmax, t);
    vmin = std::min(vmin, v);
    vmax = std::max(vmax, v);
  }
  if (vmax - vmin < 1e-9) {
    vmax += 0.5;
    vmin -= 0.5;
  }
  if (tmax <= tmin) tmax = tmin + 1;
  for (int i = 0; i <= 4; ++i) {
    int y = B - (B - T) * i / 4;
    img.Line(L, y, R, y, kGrid);
    Text(img, x0, y - 3, Num(vmin + (vmax - vmin) * i / 4), kAxis);
    int x = L + (R - L) * i / 4;
    Text(img, x - 6, B + 6, Num(tmin + (tmax - tmin) * i / 4), kAxis);
  }
  Text(img, (L + R) / 2 - 18, B + 16, "wall s", kAxis);
  img.Line(L, T, L, B, kAxis);
  img.Line(L, B, R, B, kAxis);
  int px = -1, py = -1;
  for (auto& [t, v] : s.points) {
    if (!std::isfinite(v)) continue;
    int x = L + int(double(R - L) * (t - tmin) / (tmax - tmin));
    int y = B - int(double(B - T) * (v - vmin) / (vmax - vmin));
    if (px >= 0)
      img.Line(px, py, x, y, kLine, 2);
    else
      img.Line(x, y, x, y, kLine, 2);
    px = x;
    py = y;
  }
}

void Be32(std::vector<uint8_t>& o, uint32_t v) {
  for (int i = 3; i >= 0; --i) o.push_back(uint8_t(v >> (8 * i)));
}

void Chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  Be32(out, uint32_t(data.size()));
  std::vector<uint8_t> td(type, type + 4);
  td.insert(td.end(), data.begin(), data.end());
  out.insert(out.end(), td.begin(), td.end());
  Be32(out, uint32_t(crc32(0, td.data(), uInt(td.size()))));
}

}  // namespace

void WritePlotPng(const std::string& path, const std::vector<PlotSeries>& panels) {
  const int pw = 420, ph = 300, n = std::max<int>(1, int(panels.size()));
  Image img(pw * n + 20, ph + 30);
  for (int i = 0; i < int(panels.size()); ++i) Panel(img, 10 + i * pw, 22, pw - 10, ph, panels[i]);
  std::vector<uint8_t> raw;
  raw.reserve(size_t(img.h) * (img.w * 3 + 1));
  for (int y = 0; y < img.h; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), img.rgb.begin() + size_t(y) * img.w * 3, img.rgb.begin() + size_t(y + 1) * img.w * 3);
  }
  uLongf zlen = compressBound(uLong(raw.size()));
  std::vector<uint8_t> z(zlen);
  if (compress2(z.data(), &zlen, raw.data(), uLong(raw.size()), 6) != Z_OK)
    throw Error(path + ": PNG compression failed");
  z.resize(zlen);
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  Be32(ihdr, uint32_t(img.w));
  Be32(ihdr, uint32_t(img.h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB
  Chunk(png, "IHDR", ihdr);
  Chunk(png, "IDAT", z);
  Chunk(png, "IEND", {});
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) throw Error(path + ": cannot write plot");
  bool ok = fwrite(png.data(), 1, png.size(), f) == png.size();
  ok = (fclose(f) == 0) && ok;
  if (!ok) throw Error(path + ": cannot write plot");
}

}  // namespace shoal
