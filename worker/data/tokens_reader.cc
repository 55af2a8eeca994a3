#include "worker/data/tokens_reader.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace shoal {
namespace data {

std::shared_ptr<Dataset> ReadTokens(const std::string& path, const DatasetOptions& options) {
  const int64_t T = options.seq_len, vocab = options.num_classes;
  if (T < 1) throw InputError(path + ": [data] seq_len must be set (>= 1) for format = \"tokens\"");
  if (vocab < 1 || vocab > 65536)
    throw InputError(path + ": [data] vocab_size must be in [1, 65536] for uint16 tokens, got " +
                     std::to_string(vocab));
  struct stat st;
  if (stat(path.c_str(), &st) != 0) throw InputError(path + ": cannot open the token file: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": is not a regular file (a token file of uint16 ids)");
  const int64_t bytes = int64_t(st.st_size);
  if (bytes % 2 != 0)
    throw InputError(path + ": " + std::to_string(bytes) +
                     " bytes, an odd length: not a file of uint16 tokens (truncated or the wrong file?)");
  const int64_t n = bytes / 2;
  if (n < T + 1)
    throw InputError(path + ": " + std::to_string(n) + " tokens, fewer than seq_len + 1 = " + std::to_string(T + 1) +
                     " (one window and its next-token targets)");
  // Only what max_samples windows need (plus the last target) is read.
  int64_t keep = n;
  if (options.max_samples > 0 && options.max_samples < (n - 1) / T) keep = options.max_samples * T + 1;
  std::vector<uint16_t> tokens(static_cast<size_t>(keep));
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw InputError(path + ": cannot open the token file: " + std::strerror(errno));
  const size_t got = std::fread(tokens.data(), 2, tokens.size(), f);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw TransientError(path + ": read error after " + std::to_string(got) + " tokens");
  if (got != tokens.size())
    throw InputError(path + ": ended after " + std::to_string(got) + " of " + std::to_string(keep) +
                     " tokens (the file shrank while it was read)");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  for (uint16_t& t : tokens) t = uint16_t((t >> 8) | (t << 8));  // the file is little-endian
#endif
  for (size_t i = 0; i < tokens.size(); ++i)
    if (int64_t(tokens[i]) >= vocab)
      throw InputError(path + ": token " + std::to_string(tokens[i]) + " at byte offset " + std::to_string(2 * i) +
                       " (token " + std::to_string(i) + ") is not below [data] vocab_size = " + std::to_string(vocab));
  return Dataset::FromTokens(path, std::move(tokens), T, vocab);
}

}  // namespace data
}  // namespace shoal
