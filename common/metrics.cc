#include "common/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <sys/stat.h>

#include "common/error.h"

namespace shoal {

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out;
}

void JsonObject::Key(const std::string& key) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + JsonEscape(key) + "\":";
}
JsonObject& JsonObject::Add(const std::string& key, double v) {
  Key(key);
  if (!std::isfinite(v)) { body_ += "null"; return *this; }  // JSON has no nan/inf
  char buf[32];
  snprintf(buf, sizeof buf, "%.6g", v);
  body_ += buf;
  return *this;
}
JsonObject& JsonObject::Add(const std::string& key, int64_t v) {
  Key(key);
  body_ += std::to_string(v);
  return *this;
}
JsonObject& JsonObject::Add(const std::string& key, bool v) {
  Key(key);
  body_ += v ? "true" : "false";
  return *this;
}
JsonObject& JsonObject::Add(const std::string& key, const std::string& v) {
  Key(key);
  body_ += "\"" + JsonEscape(v) + "\"";
  return *this;
}
JsonObject& JsonObject::AddNull(const std::string& key) {
  Key(key);
  body_ += "null";
  return *this;
}

void MakeDirs(const std::string& path) {
  if (path.empty()) return;
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    cur = path.substr(0, pos);
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error(cur + ": cannot create directory: " + strerror(errno));
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw Error(path + ": not a directory");
}

MetricsWriter::~MetricsWriter() {
  if (file_) fclose(file_);
}

void MetricsWriter::Open(const std::string& path, bool append) {
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) MakeDirs(path.substr(0, slash));
  std::lock_guard<std::mutex> lock(mu_);
  if (file_) fclose(file_);
  file_ = fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw Error(path + ": cannot open metrics file: " + strerror(errno));
}

double MetricsWriter::wall_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void MetricsWriter::Write(const std::string& event, int64_t step, const JsonObject& fields) {
  JsonObject head;
  head.Add("event", event).Add("step", step).Add("wall_s", wall_s());
  std::string rest = fields.str();
  std::string line = head.str();
  if (rest.size() > 2) line = line.substr(0, line.size() - 1) + "," + rest.substr(1);
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return;
  fputs(line.c_str(), file_);
  fputc('\n', file_);
  fflush(file_);
}

}  // namespace shoal
