#include <gtest/gtest.h>

#include <fstream>
#include <limits>

#include "common/error.h"
#include "common/metrics.h"

namespace shoal {
namespace {

TEST(Metrics, JsonEscapesAndNonFinite) {
  JsonObject o;
  o.Add("s", "a\"b\\c\n").Add("x", std::numeric_limits<double>::quiet_NaN()).Add("n", int64_t(3)).Add("b", true);
  EXPECT_EQ(o.str(), "{\"s\":\"a\\\"b\\\\c\\n\",\"x\":null,\"n\":3,\"b\":true}");
}

TEST(Metrics, WritesOneLinePerEvent) {
  std::string dir = ::testing::TempDir() + "/metrics_test/sub";
  MetricsWriter w;
  w.Open(dir + "/metrics.jsonl", /*append=*/false);
  w.Write("train", 5, JsonObject().Add("loss", 0.25));
  w.Write("eval", 6, JsonObject());
  std::ifstream in(dir + "/metrics.jsonl");
  std::string l1, l2, l3;
  std::getline(in, l1);
  std::getline(in, l2);
  EXPECT_FALSE(std::getline(in, l3));
  EXPECT_EQ(l1.rfind("{\"event\":\"train\",\"step\":5,\"wall_s\":", 0), 0u) << l1;
  EXPECT_NE(l1.find(",\"loss\":0.25}"), std::string::npos) << l1;
  EXPECT_EQ(l2.rfind("{\"event\":\"eval\",\"step\":6,\"wall_s\":", 0), 0u) << l2;
  EXPECT_EQ(l2.back(), '}');
}

TEST(Metrics, UnwritablePathIsAClearError) {
  MetricsWriter w;
  EXPECT_THROW(w.Open("/proc/nonexistent/dir/metrics.jsonl"), Error);
}

}  // namespace
}  // namespace shoal
