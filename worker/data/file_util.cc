#include "worker/data/file_util.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/error.h"

namespace shoal {
namespace data {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool DirExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

namespace {

struct FileCloser {
  void operator()(FILE* f) const { fclose(f); }
};

std::vector<uint8_t> ReadPlain(const std::string& path, FILE* f) {
  std::vector<uint8_t> out;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n > 0) out.reserve(size_t(n));
    fseek(f, 0, SEEK_SET);
  }
  uint8_t buf[1 << 16];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), f)) > 0) out.insert(out.end(), buf, buf + got);
  // The file is there and opened: a failing read is the disk's or the network's (EIO, a
  // stale NFS handle), which a restart may get past.
  if (ferror(f)) throw TransientError(path + ": read error: " + strerror(errno));
  return out;
}

// Inflates with zlib's stream API rather than gzread so that a truncated stream is told
// apart from a clean end (gzread hides the difference behind a short read).
std::vector<uint8_t> Inflate(const std::string& path, const std::vector<uint8_t>& in, const InflateLimit& limit) {
  z_stream zs;
  memset(&zs, 0, sizeof(zs));
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw Error(path + ": zlib inflateInit failed");
  std::vector<uint8_t> out;
  out.reserve(in.size() * 2);
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = uInt(in.size());
  uint8_t buf[1 << 16];
  int rc = Z_OK;
  int64_t cap = limit.max_bytes;
  bool header_seen = false, by_header = false;
  auto fail = [&](const std::string& msg) {
    inflateEnd(&zs);
    throw Error(path + ": " + msg);
  };
  for (;;) {
    zs.next_out = buf;
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.insert(out.end(), buf, buf + (sizeof(buf) - zs.avail_out));
    if (!header_seen && limit.declared_size && limit.header_bytes > 0 && out.size() >= limit.header_bytes) {
      header_seen = true;
      int64_t d = -1;
      try {
        d = limit.declared_size(out.data());
      } catch (...) {
        inflateEnd(&zs);
        throw;
      }
      if (d >= 0 && d <= cap) cap = d, by_header = true;
    }
    if (int64_t(out.size()) > cap) {
      if (by_header)
        fail("gzip data inflates past the " + std::to_string(cap) + " bytes " +
             (limit.what.empty() ? std::string("its header") : limit.what) +
             " declares (a gzip bomb or a corrupt file)");
      fail("gzip data inflates past " + std::to_string(cap) +
           " bytes, the cap for gzip input (a gzip bomb? store a file this big uncompressed)");
    }
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members (as `cat a.gz b.gz` makes) are one file to gunzip.
      if (zs.avail_in > 0 && inflateReset(&zs) == Z_OK) continue;
      break;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      throw Error(path + ": gzip stream is truncated (ends after " + std::to_string(out.size()) +
                  " uncompressed bytes)");
    }
    std::string msg = zs.msg ? zs.msg : ("zlib error " + std::to_string(rc));
    inflateEnd(&zs);
    throw Error(path + ": corrupt gzip data after " + std::to_string(out.size()) + " uncompressed bytes: " + msg);
  }
  inflateEnd(&zs);
  return out;
}

}  // namespace

std::vector<uint8_t> ReadFileBytes(const std::string& path, const InflateLimit& limit) {
  if (DirExists(path)) throw Error(path + ": is a directory, expected a data file");
  std::unique_ptr<FILE, FileCloser> f(fopen(path.c_str(), "rb"));
  if (!f) {
    const int e = errno;
    const std::string why = path + ": cannot open: " + strerror(e);
    // Missing, forbidden or not a file is the job's path; anything else (EIO, EMFILE, ENOMEM,
    // ESTALE, ...) is the machine's.
    if (e == ENOENT || e == ENOTDIR || e == EACCES || e == EPERM || e == ELOOP || e == ENAMETOOLONG || e == EISDIR)
      throw Error(why);
    throw TransientError(why);
  }
  std::vector<uint8_t> raw = ReadPlain(path, f.get());
  if (raw.size() >= 2 && raw[0] == 0x1f && raw[1] == 0x8b) return Inflate(path, raw, limit);
  return raw;
}

}  // namespace data
}  // namespace shoal
