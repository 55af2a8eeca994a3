// Little binary records for what Shoal keeps on disk (checkpoints): a writer that appends
// fixed-width values and length-prefixed blobs, and a reader that checks every length
// against what is left, so a truncated or corrupted record is an error naming `what`,
// never a read past the end.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/error.h"

namespace shoal {

class ByteWriter {
 public:
  template <typename T>
  ByteWriter& Put(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "plain values only");
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  ByteWriter& Blob(const void* data, size_t bytes) {
    Put<uint64_t>(bytes);
    out_.append(static_cast<const char*>(data), bytes);
    return *this;
  }
  ByteWriter& Floats(const std::vector<float>& v) { return Blob(v.data(), v.size() * sizeof(float)); }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

class ByteReader {
 public:
  ByteReader(std::string_view in, std::string what) : in_(in), what_(std::move(what)) {}
  template <typename T>
  T Get() {
    T v;
    Need(sizeof v);
    memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string_view Blob() {
    uint64_t n = Get<uint64_t>();
    Need(n);
    std::string_view v = in_.substr(pos_, size_t(n));
    pos_ += size_t(n);
    return v;
  }
  std::vector<float> Floats() {
    std::string_view b = Blob();
    SHOAL_CHECK(b.size() % sizeof(float) == 0, what_ + ": a float array of " + std::to_string(b.size()) + " bytes");
    std::vector<float> v(b.size() / sizeof(float));
    if (!b.empty()) memcpy(v.data(), b.data(), b.size());
    return v;
  }
  bool done() const { return pos_ == in_.size(); }
  void ExpectDone() const {
    SHOAL_CHECK(done(), what_ + ": " + std::to_string(in_.size() - pos_) + " unexpected bytes at the end");
  }

 private:
  void Need(uint64_t n) const {
    SHOAL_CHECK(n <= in_.size() - pos_, what_ + ": truncated (needs " + std::to_string(n) + " more bytes at offset " +
                                            std::to_string(pos_) + ", " + std::to_string(in_.size() - pos_) + " left)");
  }
  std::string_view in_;
  size_t pos_ = 0;
  std::string what_;
};

}  // namespace shoal
