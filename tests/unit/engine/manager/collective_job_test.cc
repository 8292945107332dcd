// Collective rounds through a JobManager (Job::StartAreaCollective): a job
// with no parameters attaches and reduces through the ranks' areas; values
// a rank writes into its slot are never trusted: unknown kinds, dtypes and
// ops, avg of integers, rounds larger than the area and disagreeing ranks
// fail that job only, with a clear error, while another job keeps working.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/collective_reduce.h"
#include "common/control_block.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/manager/job_manager_fixture.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

const std::vector<TestParam> kNoParams = {};
const std::vector<TestParam> kModel = {{"w", {16}, v1::FLOAT32}};

class CollectiveJobTest : public JobManagerFixture {};

TEST_F(CollectiveJobTest, JobWithoutParametersReducesThroughTheAreas) {
  auto ranks = AttachJob("coll", 2, kNoParams, 0, 0, 4096);
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    auto* v = reinterpret_cast<int32_t*>(ranks[r]->broadcast_area());
    for (int i = 0; i < 10; ++i) v[i] = (r + 1) * (i - 5);
  }
  for (int r = 0; r < 2; ++r) {
    ranks[r]->PublishCollective(
        1, static_cast<int32_t>(CollectiveKind::kAllreduce),
        static_cast<int32_t>(CollectiveDType::kInt32),
        static_cast<int32_t>(CollectiveOp::kMax), 40);
  }
  ASSERT_TRUE(ranks[0]->WaitBroadcast(1)) << ranks[0]->Error();
  ASSERT_TRUE(ranks[1]->WaitBroadcast(1));
  for (int r = 0; r < 2; ++r) {
    const auto* v =
        reinterpret_cast<const int32_t*>(ranks[r]->broadcast_area());
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(v[i], i >= 5 ? 2 * (i - 5) : i - 5) << "rank " << r;
    }
  }
  // Allgather of 3 bytes per rank; then a barrier.
  std::memcpy(ranks[0]->broadcast_area(), "abc", 3);
  std::memcpy(ranks[1]->broadcast_area(), "xyz", 3);
  for (int r = 0; r < 2; ++r) {
    ranks[r]->PublishCollective(
        2, static_cast<int32_t>(CollectiveKind::kAllgather), 0, 0, 3);
  }
  ASSERT_TRUE(ranks[0]->WaitBroadcast(2)) << ranks[0]->Error();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::string(ranks[r]->broadcast_area(), 6), "abcxyz");
  }
  for (int r = 0; r < 2; ++r) {
    ranks[r]->PublishCollective(
        3, static_cast<int32_t>(CollectiveKind::kBarrier), 0, 0, 0);
  }
  EXPECT_TRUE(ranks[1]->WaitBroadcast(3)) << ranks[1]->Error();
}

TEST_F(CollectiveJobTest, NoParametersAndNoAreaIsRefused) {
  const uint64_t s = sessions_.Open();
  v1::AttachRequest req = MakeRequest("none", 0, 1, s, kNoParams);
  absl::Status st = StartAttach(manager(), std::move(req))->Get().status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("registered no parameters and no "
                                      "collective area"));
}

struct Rogue {
  const char* name;
  int32_t kind, dtype, op;
  uint64_t bytes;
  const char* error;
};

TEST_F(CollectiveJobTest, RogueRoundsFailOnlyTheirJob) {
  const int32_t all = static_cast<int32_t>(CollectiveKind::kAllreduce);
  const Rogue cases[] = {
      {"kind", 99, 1, 0, 4, "unknown kind 99"},
      {"dtype", all, 42, 0, 4, "unknown collective dtype 42"},
      {"op", all, 1, 7, 4, "unknown reduce op 7"},
      {"avgint", all, 5, 1, 4, "avg is not supported for int32"},
      {"partial", all, 2, 0, 12, "not a whole number of float64 elements"},
      {"toolarge", static_cast<int32_t>(CollectiveKind::kAllgather), 0, 0, 3000,
       "needs 6000 bytes of collective area; the job has 4096"},
      {"barrier", static_cast<int32_t>(CollectiveKind::kBarrier), 0, 0, 8,
       "barrier with 8 bytes"},
  };
  auto healthy = AttachJob("healthy", 1, kModel, 0, 0, 64);
  ASSERT_EQ(healthy.size(), 1u);
  uint64_t healthy_round = 0;
  for (const Rogue& c : cases) {
    auto ranks = AttachJob(c.name, 2, kNoParams, 0, 0, 4096);
    ASSERT_EQ(ranks.size(), 2u);
    for (auto& r : ranks)
      r->PublishCollective(1, c.kind, c.dtype, c.op, c.bytes);
    EXPECT_FALSE(ranks[0]->WaitBroadcast(1, std::chrono::seconds(10)));
    EXPECT_EQ(ranks[0]->Error().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << ranks[0]->Error();
    EXPECT_THAT(ranks[0]->Error().message(), HasSubstr(c.error)) << c.name;
    // The other job is untouched.
    healthy[0]->PublishCollective(
        ++healthy_round, static_cast<int32_t>(CollectiveKind::kBarrier), 0, 0,
        0);
    EXPECT_TRUE(healthy[0]->WaitBroadcast(healthy_round)) << c.name;
    EXPECT_TRUE(healthy[0]->Error().ok());
  }
}

TEST_F(CollectiveJobTest, RanksThatDisagreeAreNamed) {
  auto ranks = AttachJob("dis", 3, kModel, 0, 0, 4096);
  ASSERT_EQ(ranks.size(), 3u);
  const int32_t all = static_cast<int32_t>(CollectiveKind::kAllreduce);
  ranks[0]->PublishCollective(1, all, 1, 0, 64);
  ranks[1]->PublishCollective(1, all, 1, 0, 64);
  ranks[2]->PublishCollective(
      1, static_cast<int32_t>(CollectiveKind::kReduceScatter), 1, 0, 64);
  EXPECT_FALSE(ranks[2]->WaitBroadcast(1, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[2]->Error().message(),
              HasSubstr("collective round 1: local rank 0 (global rank 0) "
                        "issued allreduce (float32, sum, 64 bytes) but local "
                        "rank 2 (global rank 2) issued reduce_scatter "
                        "(float32, sum, 64 bytes)"));
}

}  // namespace
}  // namespace gradd
