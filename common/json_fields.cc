#include "common/json_fields.h"

#include <cstdlib>

namespace shoal {

std::optional<std::string> JsonField(const std::string& line, const std::string& key) {
  std::string pat = "\"" + key + "\":";
  size_t p = 0;
  while ((p = line.find(pat, p)) != std::string::npos) {
    // Must start a key: preceded by '{' or ','.
    if (p > 0 && (line[p - 1] == '{' || line[p - 1] == ',')) break;
    p += pat.size();
  }
  if (p == std::string::npos) return std::nullopt;
  p += pat.size();
  if (p >= line.size()) return std::nullopt;
  if (line[p] == '"') {
    std::string out;
    for (size_t i = p + 1; i < line.size(); ++i) {
      char c = line[i];
      if (c == '"') return out;
      if (c == '\\' && i + 1 < line.size()) {
        char n = line[++i];
        out += n == 'n' ? '\n' : n == 't' ? '\t' : n == 'r' ? '\r' : n;
      } else {
        out += c;
      }
    }
    return std::nullopt;
  }
  size_t e = line.find_first_of(",}", p);
  if (e == std::string::npos) return std::nullopt;
  return line.substr(p, e - p);
}

std::optional<double> JsonNumber(const std::string& line, const std::string& key) {
  auto v = JsonField(line, key);
  if (!v || v->empty()) return std::nullopt;
  char* end = nullptr;
  double d = strtod(v->c_str(), &end);
  if (end == v->c_str()) return std::nullopt;
  return d;
}

}  // namespace shoal
