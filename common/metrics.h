// Metrics as JSON lines: one object per line, each with event, step and wall_s.
#pragma once
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace shoal {

// Builds one flat JSON object; keys keep insertion order.
class JsonObject {
 public:
  JsonObject& Add(const std::string& key, double v);
  JsonObject& Add(const std::string& key, int64_t v);
  JsonObject& Add(const std::string& key, int v) { return Add(key, int64_t(v)); }
  JsonObject& Add(const std::string& key, uint64_t v) { return Add(key, int64_t(v)); }
  JsonObject& Add(const std::string& key, bool v);
  JsonObject& Add(const std::string& key, const std::string& v);
  JsonObject& Add(const std::string& key, const char* v) { return Add(key, std::string(v)); }
  JsonObject& AddNull(const std::string& key);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(const std::string& key);
  std::string body_;
};

std::string JsonEscape(const std::string& s);

// Appends JSON lines to <output_dir>/metrics.jsonl (or any path); thread-safe. Each line
// is one write() on an O_APPEND descriptor, so the job's processes can share one file
// without interleaving, and a killed process loses at most the line being written.
class MetricsWriter {
 public:
  MetricsWriter();
  ~MetricsWriter();
  // Creates parent directories; throws shoal::Error naming the path on failure.
  void Open(const std::string& path, bool append = true);
  bool is_open() const { return fd_ >= 0; }
  // Adds "event", "step" and "wall_s" (seconds since this writer was created) first.
  void Write(const std::string& event, int64_t step, const JsonObject& fields);
  double wall_s() const;

 private:
  std::mutex mu_;
  int fd_ = -1;
  double start_unix_;  // the job's start (SHOAL_JOB_START from the launcher) or ours
};

// mkdir -p; throws shoal::Error naming the path.
void MakeDirs(const std::string& path);

}  // namespace shoal
