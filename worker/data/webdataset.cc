#include "worker/data/webdataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "worker/data/file_util.h"
#include "worker/data/image_folder.h"

namespace shoal {
namespace data {

namespace {

constexpr int64_t kMaxExpanded = 10000000;

std::vector<std::string> ExpandOne(const std::string& s) {
  // The first top-level group; the rest of the string is expanded recursively.
  size_t open = s.find('{');
  if (open == std::string::npos) {
    if (s.find('}') != std::string::npos) throw Error("\"" + s + "\": '}' without '{'");
    return {s};
  }
  int depth = 0;
  size_t close = std::string::npos;
  std::vector<size_t> commas;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) {
      close = i;
      break;
    }
    if (s[i] == ',' && depth == 1) commas.push_back(i);
  }
  if (close == std::string::npos) throw Error("\"" + s + "\": '{' without '}'");
  const std::string head = s.substr(0, open), body = s.substr(open + 1, close - open - 1), tail = s.substr(close + 1);
  std::vector<std::string> alts;
  const size_t dots = body.find("..");
  if (commas.empty() && dots != std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    auto digits = [](const std::string& x) {
      return !x.empty() && x.size() <= 18 && x.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(a) || !digits(b)) throw Error("\"" + s + "\": {" + body + "}: a range needs two numbers");
    const int64_t lo = std::stoll(a), hi = std::stoll(b);
    const size_t width =
        (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0') ? std::max(a.size(), b.size()) : 0;
    if (std::llabs(hi - lo) >= kMaxExpanded) throw Error("\"" + s + "\": {" + body + "}: too many shards");
    for (int64_t v = lo;; v += lo <= hi ? 1 : -1) {
      std::string n = std::to_string(v);
      if (n.size() < width) n = std::string(width - n.size(), '0') + n;
      alts.push_back(n);
      if (v == hi) break;
    }
  } else {
    size_t from = 0;
    for (size_t c : commas) {
      alts.push_back(body.substr(from, c - open - 1 - from));
      from = c - open;
    }
    alts.push_back(body.substr(from));
  }
  std::vector<std::string> out;
  const std::vector<std::string> rest = ExpandOne(tail);
  for (const std::string& alt : alts)
    for (const std::string& h : ExpandOne(head + alt))
      for (const std::string& r : rest) {
        out.push_back(h + r);
        if (int64_t(out.size()) > kMaxExpanded) throw Error("\"" + s + "\": expands to too many shards");
      }
  return out;
}

struct Member {
  int64_t shard = 0, offset = 0, size = 0;
  std::string name;
};

class TarShards : public EncodedImages {
 public:
  TarShards(std::vector<std::string> shards, std::vector<Member> images, std::vector<int64_t> sizes)
      : shards_(std::move(shards)), images_(std::move(images)), sizes_(std::move(sizes)) {}
  void Read(int64_t i, std::vector<uint8_t>* out) const override {
    const Member& m = images_[size_t(i)];
    const std::string& path = shards_[size_t(m.shard)];
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(Name(i) + ": cannot open the shard: " + strerror(errno));
    out->resize(size_t(m.size));
    size_t got = 0;
    while (got < out->size()) {
      ssize_t r = pread(fd, out->data() + got, out->size() - got, off_t(m.offset + int64_t(got)));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        const int err = errno;
        close(fd);
        throw TransientError(Name(i) + ": read error: " + strerror(err));
      }
      if (r == 0) break;
      got += size_t(r);
    }
    close(fd);
    if (got < out->size())
      throw InputError(Name(i) + ": cut short (" + std::to_string(got) + " of " + std::to_string(m.size) +
                       " bytes; the shard changed since it was scanned)");
  }
  std::string Name(int64_t i) const override {
    const Member& m = images_[size_t(i)];
    return shards_[size_t(m.shard)] + ": member " + m.name;
  }
  std::vector<int64_t> ShardSizes() const override { return sizes_; }

 private:
  std::vector<std::string> shards_;
  std::vector<Member> images_;
  std::vector<int64_t> sizes_;
};

bool ReadAt(int fd, int64_t off, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, static_cast<char*>(buf) + got, n - got, off_t(off + int64_t(got)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += size_t(r);
  }
  return true;
}

// A tar number: octal text, or GNU's base-256 (high bit set) for large sizes.
bool TarNumber(const char* p, size_t n, int64_t* v) {
  *v = 0;
  if (static_cast<unsigned char>(p[0]) & 0x80) {
    for (size_t i = 1; i < n; ++i) {
      if (*v > (int64_t(1) << 54)) return false;
      *v = (*v << 8) | static_cast<unsigned char>(p[i]);
    }
    return true;
  }
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\0')) ++i;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (*v > (int64_t(1) << 60)) return false;
    *v = *v * 8 + (p[i] - '0');
    any = true;
  }
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != '\0') return false;
  return any;
}

std::string CString(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// The "path" record of a pax extended header ("LEN path=VALUE\n" records).
std::string PaxPath(const std::string& data) {
  size_t pos = 0;
  while (pos < data.size()) {
    const size_t sp = data.find(' ', pos);
    if (sp == std::string::npos) break;
    const int64_t len = atoll(data.c_str() + pos);
    if (len <= 0 || pos + size_t(len) > data.size()) break;
    const std::string rec = data.substr(sp + 1, size_t(len) - (sp + 1 - pos) - 1);
    if (rec.rfind("path=", 0) == 0) return rec.substr(5);
    pos += size_t(len);
  }
  return "";
}

struct ScanState {
  const DatasetOptions* o;
  int64_t skipped = 0;
  void Skip(const std::string& why) {
    if (!o->skip_bad) throw InputError(why);
    fprintf(stderr, "shoal: skipping bad data ([data] skip_bad): %s\n", why.c_str());
    ++skipped;
  }
};

// One shard's samples, in file order, appended to images/labels.
void ScanShard(const std::string& path, int64_t shard, ScanState* st, std::vector<Member>* images,
               std::vector<int32_t>* labels) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    st->Skip(path + ": missing shard (" + strerror(errno) + ")");
    return;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    st->Skip(path + ": not a regular file");
    return;
  }
  const int64_t file_size = sb.st_size;
  // The sample being grouped: members with the same key in a row.
  std::string key;
  Member image;
  bool has_image = false, has_cls = false;
  int32_t label = -1;
  bool bad = false;
  auto finish = [&]() {
    if (key.empty()) return;
    if (!bad) {
      if (!has_image)
        st->Skip(path + ": sample \"" + key + "\" has no image member (.jpg, .jpeg or .png)");
      else if (!has_cls)
        st->Skip(path + ": sample \"" + key + "\" has no .cls member (its class)");
      else {
        images->push_back(image);
        labels->push_back(label);
      }
    }
    key.clear();
    has_image = has_cls = bad = false;
  };
  try {
    int64_t off = 0;
    std::string long_name;
    char h[512];
    if (file_size >= 2 && ReadAt(fd, 0, h, 2) && static_cast<unsigned char>(h[0]) == 0x1f &&
        static_cast<unsigned char>(h[1]) == 0x8b) {
      st->Skip(path + ": gzip-compressed; webdataset shards must be plain tar (each is read from the middle)");
      close(fd);
      return;
    }
    for (;;) {
      if (off + 512 > file_size) {
        if (off < file_size || off == 0)
          st->Skip(path + ": cut short: the tar ends inside a header at byte " + std::to_string(off));
        break;
      }
      if (!ReadAt(fd, off, h, 512)) throw TransientError(path + ": read error at byte " + std::to_string(off));
      if (std::all_of(h, h + 512, [](char c) { return c == 0; })) break;  // end of archive
      int64_t sum = 0, want = 0;
      for (int i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
      int64_t size = 0;
      if (!TarNumber(h + 148, 8, &want) || want != sum || !TarNumber(h + 124, 12, &size)) {
        st->Skip(path + ": corrupt tar header at byte " + std::to_string(off) + " (not a tar file, or damaged)");
        break;
      }
      const char type = h[156];
      std::string name = CString(h, 100);
      if (memcmp(h + 257, "ustar", 5) == 0 && h[345]) name = CString(h + 345, 155) + "/" + name;
      const int64_t data = off + 512, next = data + (size + 511) / 512 * 512;
      if (!long_name.empty()) name = long_name;
      if (data + size > file_size) {
        st->Skip(path + ": member " + name + " is cut short: " + std::to_string(file_size - data) + " of " +
                 std::to_string(size) + " bytes");
        break;
      }
      if (type == 'L' || type == 'x') {  // GNU long name, pax header: name the next member
        std::string text(size_t(std::min<int64_t>(size, 1 << 20)), '\0');
        if (!ReadAt(fd, data, text.data(), text.size())) throw TransientError(path + ": read error");
        long_name = type == 'L' ? CString(text.data(), text.size()) : PaxPath(text);
        off = next;
        continue;
      }
      long_name.clear();
      off = next;
      if (type != '0' && type != '\0') continue;  // folders, links, pax globals
      const size_t slash = name.rfind('/');
      const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
      if (dot == std::string::npos) continue;  // no extension: part of no sample
      const std::string k = name.substr(0, dot);
      std::string ext = name.substr(dot + 1);
      for (char& c : ext) c = char(tolower(static_cast<unsigned char>(c)));
      if (k != key) {
        finish();
        key = k;
      }
      if (ext == "jpg" || ext == "jpeg" || ext == "png") {
        image = {shard, data, size, name};
        has_image = true;
      } else if (ext == "cls") {
        char text[32] = {0};
        const size_t n = size_t(std::min<int64_t>(size, 31));
        if (!ReadAt(fd, data, text, n)) throw TransientError(path + ": read error");
        std::string t(text, n);
        while (!t.empty() && isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
        if (t.empty() || size > 31 || t.find_first_not_of("0123456789") != std::string::npos || t.size() > 9) {
          bad = true;
          st->Skip(path + ": member " + name + ": expected a class number, got \"" + t.substr(0, 20) + "\"");
        } else {
          label = int32_t(std::stol(t));
          has_cls = true;
        }
      }
    }
    finish();
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
}

}  // namespace

std::vector<std::string> ExpandBraces(const std::string& pattern) { return ExpandOne(pattern); }

std::shared_ptr<Dataset> ReadWebDataset(const std::string& path, const DatasetOptions& o) {
  const std::vector<int64_t> shape = EncodedSampleShape(path, o);
  std::vector<float> mean, stddev;
  EncodedNormalization(path, o, &mean, &stddev);
  std::vector<std::string> shards;
  size_t from = 0;
  while (from <= path.size()) {
    size_t sp = path.find(' ', from);
    if (sp == std::string::npos) sp = path.size();
    const std::string p = path.substr(from, sp - from);
    if (!p.empty()) {
      std::vector<std::string> e;
      try {
        e = ExpandBraces(p);
      } catch (const Error& err) {
        throw InputError(std::string("webdataset shards ") + err.what());
      }
      shards.insert(shards.end(), e.begin(), e.end());
    }
    from = sp + 1;
  }
  if (shards.empty()) throw InputError("webdataset: no shard named in \"" + path + "\"");
  ScanState st;
  st.o = &o;
  std::vector<Member> images;
  std::vector<int32_t> labels;
  std::vector<int64_t> sizes;
  for (size_t s = 0; s < shards.size(); ++s) {
    const size_t before = images.size();
    ScanShard(shards[s], int64_t(s), &st, &images, &labels);
    sizes.push_back(int64_t(images.size() - before));
  }
  if (images.empty())
    throw InputError(path + ": no samples (image + .cls) in " + std::to_string(shards.size()) + " shard(s)");
  int32_t top = 0;
  for (int32_t l : labels) top = std::max(top, l);
  if (o.num_classes > 0 && top >= o.num_classes)
    throw InputError(path + ": class " + std::to_string(top) +
                     " is not below [data] classes = " + std::to_string(o.num_classes));
  // A subset keeps whole shards' order: the first samples of the stream.
  if (o.max_samples > 0 && o.max_samples < int64_t(images.size())) {
    images.resize(size_t(o.max_samples));
    labels.resize(size_t(o.max_samples));
    int64_t left = o.max_samples;
    for (int64_t& n : sizes) {
      n = std::min(n, left);
      left -= n;
    }
  }
  const int64_t classes = o.num_classes > 0 ? o.num_classes : int64_t(top) + 1;
  return Dataset::FromEncoded(path, shape, std::move(labels), std::max<int64_t>(classes, 2),
                              std::make_shared<TarShards>(std::move(shards), std::move(images), std::move(sizes)),
                              std::move(mean), std::move(stddev), st.skipped);
}

}  // namespace data
}  // namespace shoal
