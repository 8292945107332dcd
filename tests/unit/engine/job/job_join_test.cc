// A Job's join engine (job_join.cc) driven through its control block, the
// test acting as the trainers (JoinSlot, ready rows, bucket memory) over the
// single-node FusedReducer: joined ranks are left out of the average and
// never written, the board tells who is authoritative, lagging rows after
// the join are not errors, and a rank that leaves during join fails the job.
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

constexpr size_t kNumel = 32;
constexpr auto kWait = std::chrono::seconds(20);

class JobJoinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    JobSpec spec;
    spec.job_id = "jj";
    spec.local_world_size = 2;
    spec.params = {
        ParamInfo{"w", {static_cast<int64_t>(kNumel)}, DType::kFloat32}};
    spec.plan = *PlanBuckets(spec.params, PlannerOptions());
    auto job = Job::Create(spec, std::make_unique<FusedReducer>(nullptr, 2));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    layout_ = std::make_unique<ControlLayout>(2, 1);
    std::vector<int> rank_blocks;
    for (int r = 0; r < 2; ++r) {
      std::vector<int> fds = job_->FdsFor(r);
      rank_blocks.push_back(fds[2]);
      bells_.push_back(fds[3]);
      memory_.push_back(*Mapping::Map(fds[1], job_->rank_memory_bytes()));
    }
    // Both trainers in one process: the job block read-only, as they get it.
    control_ = *ControlMapping::Map(*layout_, job_->FdsFor(0)[0],
                                    /*job_writable=*/false, rank_blocks);
    job_->Start();
  }

  void* base() { return control_.data(); }
  JoinSlot* slot(int r) { return layout_->join_slot(base(), r); }
  JoinBoard* board() { return layout_->join_board(base()); }
  float* grad(int r) { return static_cast<float*>(memory_[r].data()); }
  void Ring(int r) {
    RingDaemon(layout_->header(base()), layout_->rank_header(base(), r),
               bells_[r]);
  }

  void Enter(int r, uint64_t begin) {
    slot(r)->flags.store(kJoinDivideByInitialWorldSize);
    slot(r)->begin.store(begin);
    slot(r)->join_seq.store(1, std::memory_order_release);
    Ring(r);
  }
  // Rank r takes part in `it` with gradient value v.
  void Contribute(int r, uint64_t it, float v) {
    for (size_t j = 0; j < kNumel; ++j) grad(r)[j] = v;
    slot(r)->active_seq.store(it, std::memory_order_release);
    layout_->ready_row(base(), r)[0].store(it, std::memory_order_release);
    Ring(r);
  }
  bool WaitFor(const std::function<bool()>& ready) {
    return WaitForDaemon(layout_->header(base()),
                         layout_->rank_header(base(), 0), ready,
                         std::chrono::microseconds(20), kWait);
  }
  bool WaitDone(uint64_t it) {
    return WaitFor([&] { return job_->done_seq(0) >= it; });
  }

  std::unique_ptr<Job> job_;
  std::unique_ptr<ControlLayout> layout_;
  ControlMapping control_;
  std::vector<int> bells_;
  std::vector<Mapping> memory_;
};

TEST_F(JobJoinTest, JoinedRankContributesZerosAndIsNeverWritten) {
  Enter(0, 1);
  Enter(1, 1);
  // Iteration 1: both active.
  Contribute(0, 1, 2.0f);
  Contribute(1, 1, 6.0f);
  ASSERT_TRUE(WaitDone(1)) << job_->status();
  EXPECT_EQ(grad(0)[0], 4.0f);
  EXPECT_EQ(grad(1)[kNumel - 1], 4.0f);
  // Iteration 2: rank 1 has joined; rank 0's 8 is divided by the initial
  // world size, and rank 1's memory keeps what it had.
  grad(1)[0] = 123.0f;
  slot(1)->joined_at.store(2, std::memory_order_release);
  Ring(1);
  Contribute(0, 2, 8.0f);
  ASSERT_TRUE(WaitDone(2)) << job_->status();
  EXPECT_EQ(grad(0)[3], 4.0f);
  EXPECT_EQ(grad(1)[0], 123.0f);
  EXPECT_EQ(board()->decided_iteration.load(), 2u);
  EXPECT_EQ(board()->max_active.load(), 0);
  // Rank 0 runs out too: the join ends at iteration 3, rank 0 (the last to
  // join) is authoritative.
  slot(0)->joined_at.store(3, std::memory_order_release);
  Ring(0);
  ASSERT_TRUE(WaitFor([&] { return board()->done_join_seq.load() >= 1; }))
      << job_->status();
  EXPECT_EQ(board()->next_iteration.load(), 3u);
  EXPECT_EQ(board()->authoritative_rank.load(), 0);
  EXPECT_EQ(board()->exhausted_rank.load(), -1);

  // Rank 0 catches up (nothing to move) and starts iteration 3 while rank 1
  // still lags at iteration 1: not an error, just not ready.
  slot(0)->joined_at.store(0, std::memory_order_release);
  Contribute(0, 3, 1.0f);
  EXPECT_TRUE(job_->status().ok()) << job_->status();
  EXPECT_EQ(job_->done_seq(0), 2u);
  // Rank 1 catches up: rows to next_iteration - 1, then clears joined_at.
  layout_->ready_row(base(), 1)[0].store(2, std::memory_order_release);
  slot(1)->joined_at.store(0, std::memory_order_release);
  Contribute(1, 3, 3.0f);
  ASSERT_TRUE(WaitDone(3)) << job_->status();
  EXPECT_EQ(grad(0)[0], 2.0f);
  EXPECT_EQ(grad(1)[0], 2.0f);
}

TEST_F(JobJoinTest, RankLeavingDuringJoinFailsTheJob) {
  Enter(0, 1);
  Enter(1, 1);
  slot(0)->joined_at.store(1, std::memory_order_release);
  Ring(0);
  job_->RankGone(1, /*detached=*/false);
  ASSERT_TRUE(WaitFor([&] { return !job_->status().ok(); }));
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(job_->status().message(), HasSubstr("local rank 1"));
  EXPECT_THAT(job_->status().message(), HasSubstr("join"));
}

TEST_F(JobJoinTest, EnteringAfterPublishingWithoutJoinFails) {
  Enter(0, 1);
  // Rank 1 never entered join mode but goes ahead with iteration 1.
  layout_->ready_row(base(), 1)[0].store(1, std::memory_order_release);
  Ring(1);
  ASSERT_TRUE(WaitFor([&] { return !job_->status().ok(); }));
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job_->status().message(),
              HasSubstr("without entering join mode"));
}

}  // namespace
}  // namespace gradd
