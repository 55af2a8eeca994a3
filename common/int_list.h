// Comma-separated integer lists ("0,2,5"), the one text form Shoal keeps small id lists in:
// checkpoint entries and notes, rendezvous-store values. They come back from disk and the
// wire, so Parse is strict and a damaged or hostile value is a shoal::Error naming `what`
// and the item, never a crash, a wrapped number or a silently skipped item.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shoal {

// "1,2,3" from {1, 2, 3}; "" from {}. `sep` lets a message list ids as "1, 2, 3".
template <typename T>
std::string JoinIntList(const std::vector<T>& values, std::string_view sep = ",") {
  std::string s;
  for (const T& v : values) {
    if (!s.empty()) s += sep;
    s += std::to_string(v);
  }
  return s;
}

// The inverse of JoinIntList(values, ","): "" is the empty list; every item must be a whole
// decimal number that fits T (no empty item, no space, no '+', '-' only for a signed T).
// Instantiated for int, int64_t and uint64_t.
template <typename T>
std::vector<T> ParseIntList(std::string_view text, const std::string& what);

}  // namespace shoal
