// Errors: one exception type whose message names what failed and where, and one kind of
// it for input that a retry cannot fix.
#pragma once
#include <stdexcept>
#include <string>

namespace shoal {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The job itself is wrong for this process (a data file, a model that does not fit the
// data, a device the machine lacks, a rank outside the job): processes exit 2 on it, the
// code launchers read as "do not restart", since a restart would fail the same way.
class InputError : public Error {
 public:
  using Error::Error;
};

// The machine or the network failed, not the job: a read error (EIO, a stale NFS handle), a
// CUDA allocation or launch failure. A retry may get past it, so it is never taken for
// InputError, even where every other error is (a worker's start-up): processes exit 1 on it.
class TransientError : public Error {
 public:
  using Error::Error;
};

// SHOAL_CHECK(cond, msg): throws shoal::Error(msg) when cond is false. Used for input
// validation, where a clear message beats an abort.
#define SHOAL_CHECK(cond, msg)                \
  do {                                        \
    if (!(cond)) throw ::shoal::Error((msg)); \
  } while (0)

}  // namespace shoal
