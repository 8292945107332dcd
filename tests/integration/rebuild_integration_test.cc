// Bucket rebuild with the real gradd and real trainer processes
// (test_trainer --rebuild-after): the plan changes to one made from local
// rank 0's ready order, every value stays exactly right across the switch
// (moved gradients and the iterations after it), and a rank that skips
// the rebuild fails the job with a clear error instead of a hang.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;

// The text after "key=" up to the next space or end of line.
std::string Value(const std::string& output, const std::string& key) {
  const size_t at = output.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 2;
  const size_t end = output.find_first_of(" \n", begin);
  return output.substr(begin, end - begin);
}

std::vector<int> Ints(const std::string& csv) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(csv, ',', absl::SkipEmpty())) {
    int v = 0;
    EXPECT_TRUE(absl::SimpleAtoi(s, &v)) << s;
    out.push_back(v);
  }
  return out;
}

class RebuildIntegrationTest : public GraddTest {};

TEST_F(RebuildIntegrationTest, TwoTrainersRebuildAfterTheFirstIteration) {
  std::vector<Exit> exits =
      RunJob("rebuild2", 2,
             {"--iterations", "6", "--seed", "4242", "--rebuild-after", "1",
              "--bucket-cap-mb", "0.01", "--first-bucket-cap-mb", "0.002"},
             milliseconds(60000));
  ASSERT_EQ(exits.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output, HasSubstr("PASS iterations=6"));
    EXPECT_THAT(exits[r].output, HasSubstr("REBUILT"));
  }
  const std::string plan = Value(exits[0].output, "plan");
  const std::string before = Value(exits[0].output, "before");
  ASSERT_FALSE(plan.empty());
  // Every rank switched to the same plan, and it is a different one.
  EXPECT_EQ(Value(exits[1].output, "plan"), plan);
  EXPECT_NE(plan, before);

  // The plan comes from local rank 0's ready order (the ranks' random
  // orders differ): inside every bucket, parameters follow it.
  const std::vector<int> order0 = Ints(Value(exits[0].output, "order"));
  const std::vector<int> order1 = Ints(Value(exits[1].output, "order"));
  ASSERT_EQ(order0.size(), 24u);
  EXPECT_NE(order0, order1);
  std::vector<int> position(order0.size());
  for (size_t k = 0; k < order0.size(); ++k) position[order0[k]] = k;
  int buckets = 0;
  for (absl::string_view bucket : absl::StrSplit(plan, '|')) {
    ++buckets;
    const std::vector<int> params = Ints(std::string(bucket));
    for (size_t k = 1; k < params.size(); ++k) {
      EXPECT_LT(position[params[k - 1]], position[params[k]])
          << "bucket " << bucket << " is not in local rank 0's order";
    }
  }
  EXPECT_GE(buckets, 5);
}

TEST_F(RebuildIntegrationTest, ARankThatSkipsTheRebuildFailsTheJob) {
  std::vector<Exit> exits =
      RunJob("skip", 2,
             {"--iterations", "4", "--seed", "5", "--rebuild-after", "1",
              "--mode", "skip_rebuild", "--wait-timeout-ms", "20000"},
             milliseconds(40000));
  ASSERT_EQ(exits.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exits[r].code, 3) << "rank " << r << ":\n" << exits[r].output;
    EXPECT_THAT(exits[r].output,
                HasSubstr("local rank 1 of job 'skip' started iteration 2 "
                          "without rebuilding buckets"))
        << "rank " << r;
  }
  ExpectHealthyJob("after-skip");
}

}  // namespace
}  // namespace gradd::testing
