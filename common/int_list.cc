#include "common/int_list.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <type_traits>

#include "common/error.h"

namespace shoal {
namespace {

// A hostile value may be megabytes long; the error quotes enough of it to recognise.
std::string Quote(std::string_view s) {
  constexpr size_t kMax = 64;
  return "\"" + std::string(s.substr(0, kMax)) +
         (s.size() > kMax ? "...\" (" + std::to_string(s.size()) + " bytes)" : "\"");
}

}  // namespace

template <typename T>
std::vector<T> ParseIntList(std::string_view text, const std::string& what) {
  std::vector<T> out;
  if (text.empty()) return out;
  size_t pos = 0;
  while (true) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const char* first = item.data();
    const char* last = item.data() + item.size();
    T v{};
    auto [end, ec] = std::from_chars(first, last, v);
    if (item.empty() || ec != std::errc() || end != last) {
      std::string why = "is empty";
      if (!item.empty() && ec == std::errc::result_out_of_range)
        why = "is out of range [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
              std::to_string(std::numeric_limits<T>::max()) + "]";
      else if (!item.empty())
        why = std::is_signed<T>::value ? "is not an integer" : "is not a non-negative integer";
      throw Error(what + ": item " + std::to_string(out.size() + 1) + (item.empty() ? "" : " " + Quote(item)) +
                  " (at byte " + std::to_string(pos) + ") of " + Quote(text) + " " + why +
                  "; expected a comma-separated list of integers");
    }
    out.push_back(v);
    if (comma == text.size()) return out;
    pos = comma + 1;
  }
}

template std::vector<int> ParseIntList<int>(std::string_view, const std::string&);
template std::vector<int64_t> ParseIntList<int64_t>(std::string_view, const std::string&);
template std::vector<uint64_t> ParseIntList<uint64_t>(std::string_view, const std::string&);

}  // namespace shoal
