// The engine's stand-down hint (ControlHeader::stand_down_cpu, issue 36):
// while some local rank has handed a bucket over and another has not, the
// job publishes the CPU the late rank last ran on, so that waiters on that
// CPU sleep instead of spinning on the core the late rank needs; once the
// bucket is with the reducer (or nobody waits) the hint is cleared.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "common/bucket_planner.h"
#include "common/control_block.h"
#include "common/doorbell.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/fake_bucket_reducer.h"
#include "tests/unit/engine/job/job_control_test.h"

namespace gradd {
namespace {

class JobStandDownTest : public JobControlTest {
 protected:
  void SetUp() override {
    JobSpec spec = TwoBucketSpec("stand-down-unit");
    spec.num_nodes = 1;
    spec.world_size = 2;
    ASSERT_EQ(spec.plan.buckets.size(), 2u);
    net_ = std::make_shared<FakeReductions>();
    auto job = Job::Create(std::move(spec),
                           std::make_unique<FakeBucketReducer>(net_, false));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    MapControl(*job_);
    job_->Start();
  }
  void TearDown() override {
    if (job_) job_->Stop();
  }
  // Waits (bounded) until the job's hint is `want`; returns the last seen.
  uint32_t WaitForHint(uint32_t want) {
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    uint32_t seen = header_->stand_down_cpu.load();
    while (seen != want && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      seen = header_->stand_down_cpu.load();
    }
    return seen;
  }
  RankHeader* rank(int r) { return layout_->rank_header(control_.data(), r); }

  std::shared_ptr<FakeReductions> net_;
  std::unique_ptr<Job> job_;
};

TEST_F(JobStandDownTest, NamesTheLateRanksCpuUntilItHandsOver) {
  EXPECT_EQ(header_->stand_down_cpu.load(), 0u);
  // Rank 1 last ran on CPU 6 (hint 7); rank 0 hands bucket 0 over first.
  rank(1)->cpu.store(7);
  Publish(0, 0, 1);
  EXPECT_EQ(WaitForHint(7), 7u);
  // Rank 1 hands it over too: the bucket goes to the reducer, nobody waits
  // for a rank any more, and the hint is cleared.
  Publish(1, 0, 1);
  EXPECT_EQ(WaitForHint(0), 0u);
  ASSERT_TRUE(net_->WaitStarted(1));
}

TEST_F(JobStandDownTest, NoHintWhileNoRankHasHandedOver) {
  rank(0)->cpu.store(3);
  rank(1)->cpu.store(3);
  // A ring without a publish: the engine scans and finds no bucket that
  // one rank waits in for another.
  RingDaemon(header_, me_, bells_[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(header_->stand_down_cpu.load(), 0u);
}

}  // namespace
}  // namespace gradd
