// What one process keeps in a checkpoint: the record (which checkpoint, the data position)
// and named byte strings (weights, optimizer slots, an algorithm's own state). Readers name
// the entry they miss, so a checkpoint of another model or algorithm is one clear error.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/byte_codec.h"
#include "common/checkpoint_record.h"
#include "common/error.h"

namespace shoal {

struct CheckpointState {
  CheckpointRecord record;
  std::map<std::string, std::string> entries;

  void Put(const std::string& key, std::string bytes) { entries[key] = std::move(bytes); }
  void PutFloats(const std::string& key, const float* v, size_t n) {
    Put(key, std::string(reinterpret_cast<const char*>(v), n * sizeof(float)));
  }
  void PutFloats(const std::string& key, const std::vector<float>& v) { PutFloats(key, v.data(), v.size()); }
  void PutInt(const std::string& key, int64_t v) { Put(key, std::string(reinterpret_cast<const char*>(&v), 8)); }
  void PutDouble(const std::string& key, double v) { Put(key, std::string(reinterpret_cast<const char*>(&v), 8)); }

  bool Has(const std::string& key) const { return entries.count(key) > 0; }
  const std::string& Get(const std::string& key) const {
    auto it = entries.find(key);
    SHOAL_CHECK(it != entries.end(), "checkpoint " + std::to_string(record.id) + ": no entry '" + key +
                                         "' (written by another model or algorithm?)");
    return it->second;
  }
  // Exactly n floats into out.
  void GetFloats(const std::string& key, float* out, size_t n) const {
    const std::string& v = Get(key);
    SHOAL_CHECK(v.size() == n * sizeof(float), "checkpoint " + std::to_string(record.id) + ": entry '" + key +
                                                   "' holds " + std::to_string(v.size()) + " bytes, expected " +
                                                   std::to_string(n) + " floats");
    if (n) memcpy(out, v.data(), v.size());
  }
  std::vector<float> GetFloatVector(const std::string& key, size_t n) const {
    std::vector<float> out(n);
    GetFloats(key, out.data(), n);
    return out;
  }
  int64_t GetInt(const std::string& key) const { return Fixed<int64_t>(key); }
  double GetDouble(const std::string& key) const { return Fixed<double>(key); }

 private:
  template <typename T>
  T Fixed(const std::string& key) const {
    ByteReader r(Get(key), "checkpoint " + std::to_string(record.id) + " entry '" + key + "'");
    T v = r.Get<T>();
    r.ExpectDone();
    return v;
  }
};

}  // namespace shoal
