#include "worker/data/tokens_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace shoal {
namespace data {

namespace {

// A read-only private map of a whole file; unmapped when the last Dataset holding it goes.
class MappedFile {
 public:
  MappedFile(void* p, size_t n) : p_(p), n_(n) {}
  ~MappedFile() { munmap(p_, n_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const void* data() const { return p_; }

 private:
  void* p_;
  size_t n_;
};

std::string BadTokenLine(const std::string& path, const uint16_t* t, int64_t k, int64_t vocab) {
  return path + ": token " + std::to_string(t[k]) + " at byte offset " + std::to_string(2 * k) + " (token " +
         std::to_string(k) + ") is not below [data] vocab_size = " + std::to_string(vocab);
}

}  // namespace

std::shared_ptr<Dataset> ReadTokens(const std::string& path, const DatasetOptions& options) {
  const int64_t T = options.seq_len, vocab = options.num_classes;
  if (T < 1) throw InputError(path + ": [data] seq_len must be set (>= 1) for format = \"tokens\"");
  if (vocab < 1 || vocab > 65536)
    throw InputError(path + ": [data] vocab_size must be in [1, 65536] for uint16 tokens, got " +
                     std::to_string(vocab));
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open the token file: " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    throw InputError(path + ": cannot stat the token file: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    throw InputError(path + ": is not a regular file (a token file of uint16 ids)");
  }
  const int64_t bytes = int64_t(st.st_size);
  if (bytes == 0) {
    close(fd);
    throw InputError(path + ": empty (0 bytes, 0 tokens): a token file needs at least seq_len + 1 = " +
                     std::to_string(T + 1) + " uint16 ids");
  }
  if (bytes % 2 != 0) {
    close(fd);
    throw InputError(path + ": " + std::to_string(bytes) +
                     " bytes, an odd length: not a file of uint16 tokens (truncated or the wrong file?)");
  }
  const int64_t n = bytes / 2;
  if (n < T + 1) {
    close(fd);
    throw InputError(path + ": " + std::to_string(n) + " tokens, fewer than seq_len + 1 = " + std::to_string(T + 1) +
                     " (one window and its next-token targets)");
  }
  // Mapped, not read: a GPT's training file is many GB, and the page cache shares it among
  // the workers of a host and drops what is not in use. A file cut short while mapped would
  // fault (SIGBUS) on the missing pages; token files are written once, before training.
  void* p = mmap(nullptr, size_t(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (p == MAP_FAILED) throw InputError(path + ": cannot map the token file: " + std::strerror(map_errno));
  auto map = std::make_shared<const MappedFile>(p, size_t(bytes));

  // max_samples: the ids of that many windows and room to shift them (see shifted_windows).
  int64_t keep = n;
  if (options.max_samples > 0 && options.max_samples < n / T) keep = std::min(n, (options.max_samples + 1) * T);
  std::shared_ptr<const void> owner = map;
  const uint16_t* tokens = static_cast<const uint16_t*>(map->data());
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  // The file is little-endian: a big-endian host works on a swapped copy.
  auto copy = std::make_shared<std::vector<uint16_t>>(tokens, tokens + keep);
  for (uint16_t& t : *copy) t = uint16_t((t >> 8) | (t << 8));
  tokens = copy->data();
  owner = copy;
#endif

  // One pass over the ids before any training: a bad id found at load costs no compute, and
  // without it every window would need checking as it is read. With skip_bad the windows
  // holding one are replaced where they are read (DataLoader), as a bad image is; a file
  // without bad ids costs those windows no check.
  madvise(p, size_t(bytes), MADV_SEQUENTIAL);
  int64_t bad = 0, first_bad = -1;
  constexpr int64_t kChunk = 1 << 16;
  for (int64_t c = 0; c < keep; c += kChunk) {
    const int64_t end = std::min(keep, c + kChunk);
    uint16_t top = 0;
    for (int64_t k = c; k < end; ++k) top = std::max(top, tokens[k]);  // vectorizes
    if (int64_t(top) < vocab) continue;
    for (int64_t k = c; k < end; ++k)
      if (int64_t(tokens[k]) >= vocab) {
        if (first_bad < 0) first_bad = k;
        ++bad;
      }
    if (!options.skip_bad) break;
  }
  madvise(p, size_t(bytes), MADV_NORMAL);
  if (bad > 0 && !options.skip_bad)
    throw InputError(BadTokenLine(path, tokens, first_bad, vocab) +
                     " ([data] skip_bad = true skips the windows that hold such ids)");
  // Mostly bad ids mean a wrong vocab_size or not a token file, not a few damaged records:
  // skipping would train on what is left of it.
  if (bad > 0 && bad * 2 > keep)
    throw InputError(BadTokenLine(path, tokens, first_bad, vocab) + ", and so are " + std::to_string(bad) + " of its " +
                     std::to_string(keep) +
                     " ids: is [data] vocab_size right? (skip_bad skips a few bad windows, "
                     "not most of the file)");
  return Dataset::FromTokens(path, std::move(owner), tokens, keep, T, vocab, bad);
}

}  // namespace data
}  // namespace shoal
