// Errors: one exception type whose message names what failed and where.
#pragma once
#include <stdexcept>
#include <string>

namespace shoal {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// SHOAL_CHECK(cond, msg): throws shoal::Error(msg) when cond is false. Used for input
// validation, where a clear message beats an abort.
#define SHOAL_CHECK(cond, msg)                \
  do {                                        \
    if (!(cond)) throw ::shoal::Error((msg)); \
  } while (0)

}  // namespace shoal
