// The comma-separated integer lists kept in checkpoints and the rendezvous store: a round
// trip is exact, and every damaged or hostile list is an error naming what was parsed and
// the item, never a wrapped number, a skipped item or a crash.
#include "common/int_list.h"

#include <gtest/gtest.h>

#include <limits>

#include "common/error.h"

namespace shoal {
namespace {

// The message ParseIntList<T>(text) throws; fails the test when it accepts text.
template <typename T>
std::string Refusal(const std::string& text) {
  try {
    std::vector<T> v = ParseIntList<T>(text, "note 'x'");
    ADD_FAILURE() << "\"" << text << "\" was accepted as " << v.size() << " item(s)";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(IntList, RoundTripsExactlyAtTheLimitsOfEachType) {
  const std::vector<uint64_t> ids{0, 7, std::numeric_limits<uint64_t>::max()};
  EXPECT_EQ(JoinIntList(ids), "0,7,18446744073709551615");
  EXPECT_EQ(ParseIntList<uint64_t>(JoinIntList(ids), "ids"), ids);
  const std::vector<int64_t> sizes{std::numeric_limits<int64_t>::min(), -1, 0, std::numeric_limits<int64_t>::max()};
  EXPECT_EQ(ParseIntList<int64_t>(JoinIntList(sizes), "sizes"), sizes);
  const std::vector<int> ranks{3};
  EXPECT_EQ(ParseIntList<int>(JoinIntList(ranks), "ranks"), ranks);
  EXPECT_EQ(JoinIntList(std::vector<int>{}), "");
  EXPECT_TRUE(ParseIntList<int>("", "ranks").empty());
  EXPECT_EQ(JoinIntList(ids, ", "), "0, 7, 18446744073709551615");
}

TEST(IntList, EmptyItemsJunkAndSignsAreRefused) {
  for (const char* bad : {",", "1,", ",1", "1,,2", " 1", "1 ", "+1", "1x", "0x10", "1.5", "1;2", "-"}) {
    std::string m = Refusal<int64_t>(bad);
    EXPECT_NE(m.find("note 'x': item "), std::string::npos) << bad << ": " << m;
  }
  EXPECT_NE(Refusal<int64_t>("1,,2").find("item 2 (at byte 2) of \"1,,2\" is empty"), std::string::npos)
      << Refusal<int64_t>("1,,2");
  EXPECT_NE(Refusal<int64_t>("5,6,x7").find("item 3 \"x7\" (at byte 4) of \"5,6,x7\" is not an integer"),
            std::string::npos)
      << Refusal<int64_t>("5,6,x7");
  // A checkpoint id or rank count has no sign.
  EXPECT_NE(Refusal<uint64_t>("1,-2").find("item 2 \"-2\" (at byte 2) of \"1,-2\" is not a non-negative integer"),
            std::string::npos)
      << Refusal<uint64_t>("1,-2");
  EXPECT_EQ(ParseIntList<int>("-2", "r"), std::vector<int>{-2});
}

TEST(IntList, OverflowIsRefusedNotWrapped) {
  EXPECT_NE(Refusal<uint64_t>("18446744073709551616").find("is out of range [0, 18446744073709551615]"),
            std::string::npos)
      << Refusal<uint64_t>("18446744073709551616");
  EXPECT_NE(Refusal<int64_t>("-9223372036854775809").find("out of range"), std::string::npos);
  EXPECT_NE(Refusal<int>("0,2147483648").find("item 2"), std::string::npos);
  EXPECT_NE(Refusal<int>("99999999999999999999999999999999").find("out of range"), std::string::npos);
}

TEST(IntList, AHugeHostileValueIsQuotedShort) {
  std::string huge(1 << 20, '7');
  huge += ",x";
  std::string m = Refusal<uint64_t>(huge);
  EXPECT_NE(m.find("is out of range"), std::string::npos) << m.substr(0, 300);
  EXPECT_NE(m.find("(1048578 bytes)"), std::string::npos) << m.substr(0, 300);
  EXPECT_LT(m.size(), 400u);
}

}  // namespace
}  // namespace shoal
