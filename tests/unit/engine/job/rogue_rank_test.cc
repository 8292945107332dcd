// A rogue rank against a real Job (issue 11): with what the daemon sends it
// (FdsFor), it cannot reach the other rank's rows or memory, cannot write
// done_seq / status / error, and vandalising its own wake-up words does not
// cost the honest rank its averaged results or its wake-ups.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/shm.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/bucket_reducer.h"
#include "tests/unit/common/write_fault.h"

namespace gradd {
namespace {

constexpr size_t kNumel = 64;

ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return st.st_ino;
}

class RogueRankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    JobSpec spec;
    spec.job_id = "rogue";
    spec.local_world_size = 2;
    spec.spin = std::chrono::microseconds(0);  // the daemon always sleeps
    spec.params = {
        ParamInfo{"w", {static_cast<int64_t>(kNumel)}, DType::kFloat32}};
    spec.plan = *PlanBuckets(spec.params, PlannerOptions());
    auto job = Job::Create(spec, std::make_unique<FusedReducer>(nullptr, 2));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    layout_ = std::make_unique<ControlLayout>(2, job_->bucket_slots());
    for (int r = 0; r < 2; ++r) {
      std::vector<int> fds = job_->FdsFor(r);
      ASSERT_EQ(fds.size(), 4u);
      auto m = ControlMapping::MapRank(*layout_, fds[0], r, fds[2]);
      ASSERT_TRUE(m.ok()) << m.status();
      ctl_.push_back(*std::move(m));
      mem_.push_back(*Mapping::Map(fds[1], job_->rank_memory_bytes()));
      bells_.push_back(fds[3]);
    }
    job_->Start();
  }
  void TearDown() override {
    if (job_) job_->Stop();
  }

  void* base(int r) { return ctl_[r].data(); }
  ControlHeader* header(int r) { return layout_->header(base(r)); }
  RankHeader* me(int r) { return layout_->rank_header(base(r), r); }
  float* grad(int r) { return static_cast<float*>(mem_[r].data()); }
  void Publish(int r, uint64_t it) {
    layout_->ready_row(base(r), r)[0].store(it, std::memory_order_release);
    RingDaemon(header(r), me(r), bells_[r]);
  }

  std::unique_ptr<Job> job_;
  std::unique_ptr<ControlLayout> layout_;
  std::vector<ControlMapping> ctl_;
  std::vector<Mapping> mem_;
  std::vector<int> bells_;
};

TEST_F(RogueRankTest, FdsHoldNothingOfTheOtherRank) {
  std::vector<int> a = job_->FdsFor(0);
  std::vector<int> b = job_->FdsFor(1);
  // Shared: only the job block. Rank memory, rank block and bell differ.
  EXPECT_EQ(Inode(a[0]), Inode(b[0]));
  for (int i = 1; i < 4; ++i) {
    for (int j = 1; j < 4; ++j) EXPECT_NE(Inode(a[i]), Inode(b[j]));
  }
  // The rank block holds one rank's block, not the others' rows.
  struct stat st {};
  ASSERT_EQ(fstat(b[2], &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), layout_->rank_block_bytes());
  // Rank 0's ready row is not mapped in rank 1's range.
  auto* other = layout_->ready_row(base(1), 0);
  EXPECT_EXIT(other[0].store(1), ::gradd::testing::DiedOfWriteFault,
              ::gradd::testing::kWriteFaultOutput);
}

TEST_F(RogueRankTest, CannotWriteDoneStatusOrError) {
  // The job block is mapped read-only: every store faults.
  EXPECT_EXIT(layout_->done_seq(base(1))[0].store(7),
              ::gradd::testing::DiedOfWriteFault,
              ::gradd::testing::kWriteFaultOutput);
  EXPECT_EXIT(header(1)->status.store(13), ::gradd::testing::DiedOfWriteFault,
              ::gradd::testing::kWriteFaultOutput);
  EXPECT_EXIT(header(1)->error[0] = 'x', ::gradd::testing::DiedOfWriteFault,
              ::gradd::testing::kWriteFaultOutput);
  // ... and no writable mapping of it can be made.
  EXPECT_EQ(mmap(nullptr, layout_->job_bytes(), PROT_READ | PROT_WRITE,
                 MAP_SHARED, job_->FdsFor(1)[0], 0),
            MAP_FAILED);
  EXPECT_TRUE(job_->status().ok());
}

// 50 iterations in which rank 1 keeps zeroing its doorbell word and its
// sleeping flag: rank 0, sleeping on every wait (no spin), still gets the
// average every iteration and never runs into its (generous) wait bound.
TEST_F(RogueRankTest, VandalisedWakeupWordsDoNotStallTheHonestRank) {
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      me(1)->doorbell.store(0, std::memory_order_relaxed);
      me(1)->sleeping.store(0, std::memory_order_relaxed);
    }
  });
  for (uint64_t it = 1; it <= 50; ++it) {
    for (size_t j = 0; j < kNumel; ++j) {
      grad(0)[j] = static_cast<float>(it);
      grad(1)[j] = static_cast<float>(3 * it);
    }
    Publish(1, it);
    Publish(0, it);
    const auto* done = &layout_->done_seq(base(0))[0];
    ASSERT_TRUE(WaitForDaemon(
        header(0), me(0),
        [&] { return done->load(std::memory_order_acquire) >= it; },
        std::chrono::nanoseconds(0), std::chrono::seconds(20)))
        << "iteration " << it << ": " << job_->status();
    for (size_t j = 0; j < kNumel; ++j) {
      ASSERT_EQ(grad(0)[j], static_cast<float>(2 * it)) << it;
    }
  }
  stop.store(true);
  vandal.join();
  EXPECT_TRUE(job_->status().ok()) << job_->status();
}

}  // namespace
}  // namespace gradd
