#include "worker/engine/onnx/window.h"

#include <algorithm>

#include "common/error.h"
#include "worker/engine/onnx/attrs.h"

namespace shoal {

Shape As4d(const Shape& s, const std::string& where) {
  SHOAL_CHECK(s.size() == 3 || s.size() == 4,
              where + ": input " + ShapeString(s) + " must be [N,C,L] or [N,C,H,W] (1-D and 2-D are supported)");
  return s.size() == 4 ? s : Shape{s[0], s[1], s[2], 1};
}

Window ReadWindow(const onnx::NodeProto& n, const Shape& xs, int spatial, const int64_t* kernel,
                  const std::string& where) {
  SHOAL_CHECK(spatial >= 1 && spatial <= 3 && int(xs.size()) >= 2 + spatial,
              where + ": input " + ShapeString(xs) + " must have 1 to 3 spatial dimensions");
  Window w;
  const std::vector<int64_t> st = AttrInts(n, "strides"), di = AttrInts(n, "dilations"), pads = AttrInts(n, "pads");
  SHOAL_CHECK(st.empty() || int(st.size()) == spatial, where + ": strides do not match the spatial rank");
  SHOAL_CHECK(di.empty() || int(di.size()) == spatial, where + ": dilations do not match the spatial rank");
  SHOAL_CHECK(pads.empty() || int(pads.size()) == 2 * spatial, where + ": pads do not match the spatial rank");
  for (int i = 0; i < spatial; ++i) {
    w.k[i] = kernel[i];
    if (!st.empty()) w.s[i] = st[size_t(i)];
    if (!di.empty()) w.d[i] = di[size_t(i)];
    if (!pads.empty()) {
      w.pb[i] = pads[size_t(i)];
      w.pe[i] = pads[size_t(i + spatial)];
    }
    SHOAL_CHECK(w.k[i] > 0 && w.s[i] > 0 && w.d[i] > 0 && w.pb[i] >= 0 && w.pe[i] >= 0,
                where + ": kernel, strides and dilations must be positive and pads non-negative");
  }
  const std::string autopad = AttrString(n, "auto_pad", "NOTSET");
  if (autopad == "SAME_UPPER" || autopad == "SAME_LOWER") {
    for (int i = 0; i < spatial; ++i) {
      const int64_t in = xs[size_t(2 + i)], out = (in + w.s[i] - 1) / w.s[i];
      const int64_t total = std::max<int64_t>(0, (out - 1) * w.s[i] + (w.k[i] - 1) * w.d[i] + 1 - in);
      w.pb[i] = autopad == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pe[i] = total - w.pb[i];
    }
  } else if (autopad == "VALID") {
    for (int i = 0; i < spatial; ++i) w.pb[i] = w.pe[i] = 0;
  } else {
    SHOAL_CHECK(autopad == "NOTSET", where + ": auto_pad " + autopad + " is not supported");
  }
  return w;
}

bool Symmetric(const Window& w) {
  for (int i = 0; i < 3; ++i)
    if (w.pb[i] != w.pe[i]) return false;
  return true;
}

}  // namespace shoal
