// Join (uneven inputs) through the C ABI with real trainer processes and a
// real daemon: ranks with different numbers of inputs, both divide factors.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace gradd::testing {
namespace {

using ::testing::HasSubstr;

class JoinTest : public GraddTest, public ::testing::WithParamInterface<int> {};

TEST_P(JoinTest, UnevenInputsAverageOverTheActiveRanks) {
  const int world = 3;
  const std::string job = absl::StrCat("join-c-", GetParam());
  std::vector<Proc> ps;
  for (int r = 0; r < world; ++r) {
    ps.push_back(Spawn(absl::StrCat(job, ".rank", r),
                       {GRADD_C_JOIN_TRAINER, socket_, job, absl::StrCat(r),
                        absl::StrCat(world), absl::StrCat(GetParam())}));
  }
  std::vector<Exit> exits = WaitAll(ps, milliseconds(60000));
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(exits[r].code, 0) << "rank " << r << ":\n" << exits[r].output;
    // 2 + r join iterations for the longest rank (4), then one plain one.
    EXPECT_THAT(exits[r].output, HasSubstr("PASS iteration 6"));
  }
}

INSTANTIATE_TEST_SUITE_P(DivideFactors, JoinTest, ::testing::Values(1, 0),
                         [](const auto& info) {
                           return info.param ? "ByInitialWorldSize"
                                             : "ByActiveRanks";
                         });

}  // namespace
}  // namespace gradd::testing
