#include "common/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>

#include "common/error.h"

namespace shoal {

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
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
  if (!std::isfinite(v)) {
    body_ += "null";
    return *this;
  }  // JSON has no nan/inf
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

static double UnixNow() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  return double(tv.tv_sec) + 1e-6 * double(tv.tv_usec);
}

MetricsWriter::MetricsWriter() : start_unix_(UnixNow()) {
  if (const char* s = getenv("SHOAL_JOB_START")) {
    char* end = nullptr;
    double v = strtod(s, &end);
    if (end != s && v > 0 && v <= start_unix_) start_unix_ = v;
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) close(fd_);
}

void MetricsWriter::Open(const std::string& path, bool append) {
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) MakeDirs(path.substr(0, slash));
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) close(fd_);
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (append ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) throw Error(path + ": cannot open metrics file: " + strerror(errno));
}

double MetricsWriter::wall_s() const { return UnixNow() - start_unix_; }

void MetricsWriter::Write(const std::string& event, int64_t step, const JsonObject& fields) {
  JsonObject head;
  head.Add("event", event).Add("step", step).Add("wall_s", wall_s());
  std::string rest = fields.str();
  std::string line = head.str();
  if (rest.size() > 2) line = line.substr(0, line.size() - 1) + "," + rest.substr(1);
  line += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  size_t off = 0;
  while (off < line.size()) {
    ssize_t n = write(fd_, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // disk full: metrics are best-effort, training goes on
    off += size_t(n);
  }
}

}  // namespace shoal
