// Job's plan switch (bucket rebuild) driven by hand: a fake reducer that
// completes buckets only when the test says so, ranks acting on the real
// control block. Checks that the switch happens exactly at the iteration
// boundary and that ranks running ahead fail the job.
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/fake_device_memory.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/job/job.h"
#include "server/engine/reduce/fake_bucket_reducer.h"
#include "tests/unit/engine/job/job_control_test.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobRebuildTest : public JobControlTest {
 protected:
  // Four float32 parameters of 64 bytes, caps that put two per bucket:
  // attach plan [3, 2] [1, 0]. `cuda`: every parameter on the (fake) GPU
  // both ranks share.
  void SetUp() override { MakeJob(/*cuda=*/false); }
  void MakeJob(bool cuda) {
    JobSpec spec;
    spec.job_id = "rebuild-unit";
    spec.local_world_size = 2;
    for (int i = 0; i < 4; ++i) {
      spec.params.push_back({"p" + std::to_string(i), {16}, DType::kFloat32});
      if (cuda) spec.params.back().device = DeviceKind::kCuda;
    }
    if (cuda) {
      spec.devices = &devices_;
      spec.rank_devices = {0, 0};
    }
    spec.planner.first_bucket_cap_bytes = 128;
    spec.planner.bucket_cap_bytes = 128;
    spec.plan = *PlanBuckets(spec.params, spec.planner);
    ASSERT_EQ(spec.plan.buckets.size(), 2u);
    params_ = spec.params;
    reducer_ = std::make_shared<FakeReductions>();
    auto job = Job::Create(std::move(spec),
                           std::make_unique<FakeBucketReducer>(reducer_));
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *std::move(job);
    MapControl(*job_);
    job_->Start();
  }
  void TearDown() override {
    if (job_) job_->Stop();
  }

  bool WaitError() {
    return WaitForDaemon(
        header_, me_,
        [&] { return header_->status.load(std::memory_order_acquire) != 0; },
        std::chrono::microseconds(20), std::chrono::seconds(10));
  }
  // Runs iteration `it` of the current `buckets` to completion.
  void RunIteration(int buckets, uint64_t it, size_t* next_start) {
    for (int b = 0; b < buckets; ++b) {
      Publish(0, b, it);
      Publish(1, b, it);
    }
    ASSERT_TRUE(reducer_->WaitStarted(*next_start + buckets));
    for (int b = 0; b < buckets; ++b) reducer_->Finish((*next_start)++);
    ASSERT_TRUE(WaitForDaemon(
        header_, me_,
        [&] {
          for (int b = 0; b < buckets; ++b) {
            if (Done(b) < it) return false;
          }
          return true;
        },
        std::chrono::microseconds(20), std::chrono::seconds(10)));
  }

  FakeDeviceAllocator devices_{{std::string(16, 'g')}};
  std::vector<ParamInfo> params_;
  std::shared_ptr<FakeReductions> reducer_;
  std::unique_ptr<Job> job_;
};

struct SwitchResult {
  absl::Notification done;
  absl::Status status = absl::UnknownError("pending");
};

// job.SwitchPlan(iteration, plan), its answer recorded in the result.
std::shared_ptr<SwitchResult> RequestSwitch(Job& job, uint64_t iteration,
                                            BucketPlan plan) {
  auto result = std::make_shared<SwitchResult>();
  job.SwitchPlan(iteration, std::move(plan), [result](absl::Status s) {
    result->status = std::move(s);
    result->done.Notify();
  });
  return result;
}

TEST_F(JobRebuildTest, SwitchesOnlyOnceTheIterationIsComplete) {
  EXPECT_EQ(job_->bucket_slots(), 4u);  // a slot per parameter
  size_t next = 0;
  RunIteration(2, 1, &next);

  // Iteration 2: bucket 0 reduced, bucket 1 still with the reducer.
  Publish(0, 0, 2);
  Publish(1, 0, 2);
  Publish(0, 1, 2);
  Publish(1, 1, 2);
  ASSERT_TRUE(reducer_->WaitStarted(next + 2));
  reducer_->Finish(next++);

  // Rebuild after iteration 2 into one bucket per parameter.
  PlannerOptions one_each;
  one_each.first_bucket_cap_bytes = 1;
  one_each.bucket_cap_bytes = 1;
  BucketPlan plan = *PlanBucketsInOrder(params_, {0, 2, 1, 3}, one_each);
  job_->ExpectRebuild(2);
  auto result = RequestSwitch(*job_, 2, plan);
  // Not while bucket 1 of iteration 2 is in flight.
  EXPECT_FALSE(
      result->done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  EXPECT_TRUE(reducer_->replans().empty());
  reducer_->Finish(next++);
  ASSERT_TRUE(result->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(result->status.ok()) << result->status;
  EXPECT_THAT(reducer_->replans(), ElementsAre(std::pair<uint64_t, int>(3, 4)));
  for (int b = 0; b < 4; ++b) EXPECT_EQ(Done(b), 2u);
  EXPECT_TRUE(job_->status().ok());

  // Iteration 3 runs on the new plan: four buckets of 16 elements each.
  RunIteration(4, 3, &next);
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(reducer_->at(next - 4 + b), (std::pair<int, uint64_t>(b, 3)));
    EXPECT_EQ(reducer_->elements(next - 4 + b), 16u);
  }
  EXPECT_TRUE(job_->status().ok());
}

// Autotune's partition trials: the switch sets the reducer's network
// partition from the first iteration of the new plan on; a switch without
// one leaves it alone.
TEST_F(JobRebuildTest, ASwitchCanSetTheReducersPartition) {
  size_t next = 0;
  RunIteration(2, 1, &next);
  job_->ExpectRebuild(1);
  auto same = std::make_shared<SwitchResult>();
  job_->SwitchPlan(
      1, job_->spec().plan,
      [same](absl::Status s) {
        same->status = std::move(s);
        same->done.Notify();
      },
      size_t{4096});
  ASSERT_TRUE(same->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(same->status.ok()) << same->status;
  EXPECT_THAT(reducer_->partitions(),
              ElementsAre(std::pair<uint64_t, size_t>(2, 4096)));
  RunIteration(2, 2, &next);
  job_->ExpectRebuild(2);
  auto plain = RequestSwitch(*job_, 2, job_->spec().plan);
  ASSERT_TRUE(plain->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(plain->status.ok()) << plain->status;
  EXPECT_EQ(reducer_->partitions().size(), 1u);
  EXPECT_EQ(reducer_->replans().size(), 2u);
  EXPECT_TRUE(job_->status().ok());
}

// A plan that needs more device memory than the job holds is refused at
// the boundary (the ranks' mappings cannot grow), failing the job.
TEST_F(JobRebuildTest, APlanBeyondTheDeviceRegionFailsTheJob) {
  size_t next = 0;
  RunIteration(2, 1, &next);
  BucketPlan plan = job_->spec().plan;
  plan.device_bytes = 1 << 20;
  job_->ExpectRebuild(1);
  auto result = RequestSwitch(*job_, 1, plan);
  ASSERT_TRUE(result->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result->status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(result->status.message()),
              AllOf(HasSubstr("1048576 bytes of device memory"),
                    HasSubstr("and 0-byte device region")));
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(reducer_->replans().empty());
}

class CudaJobRebuildTest : public JobRebuildTest {
 protected:
  void SetUp() override { MakeJob(/*cuda=*/true); }
};

// A CUDA job switches like a CPU one; the new plan's buckets are the
// daemon's device addresses of each rank's (unchanged) device memory.
TEST_F(CudaJobRebuildTest, TheNewBucketsLieInTheSameDeviceMemory) {
  size_t next = 0;
  RunIteration(2, 1, &next);
  // Each rank's device memory, from attach bucket 0's address.
  const auto [first_device, first] = reducer_->buffers(0);
  ASSERT_EQ(first_device, DeviceKind::kCuda);
  ASSERT_EQ(reducer_->at(0).first, 0);
  std::vector<char*> base;
  for (void* p : first) {
    base.push_back(static_cast<char*>(p) - job_->spec().plan.buckets[0].offset);
  }
  PlannerOptions one_each;
  one_each.first_bucket_cap_bytes = 1;
  one_each.bucket_cap_bytes = 1;
  BucketPlan plan = *PlanBucketsInOrder(params_, {0, 2, 1, 3}, one_each);
  ASSERT_EQ(plan.buckets.size(), 4u);
  ASSERT_GT(plan.device_bytes, 0u);
  job_->ExpectRebuild(1);
  auto result = RequestSwitch(*job_, 1, plan);
  ASSERT_TRUE(result->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(result->status.ok()) << result->status;
  EXPECT_THAT(reducer_->replans(), ElementsAre(std::pair<uint64_t, int>(2, 4)));
  RunIteration(4, 2, &next);
  for (int b = 0; b < 4; ++b) {
    const auto [device, buffers] = reducer_->buffers(next - 4 + b);
    EXPECT_EQ(device, DeviceKind::kCuda);
    ASSERT_EQ(buffers.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(static_cast<char*>(buffers[r]) - base[r],
                static_cast<ptrdiff_t>(plan.buckets[b].offset))
          << "bucket " << b << " rank " << r;
    }
  }
  EXPECT_NE(base[0], base[1]);
  EXPECT_TRUE(job_->status().ok());
}

TEST_F(JobRebuildTest, ARankThatSkipsTheRebuildFailsTheJob) {
  size_t next = 0;
  RunIteration(2, 1, &next);
  job_->ExpectRebuild(1);
  // Local rank 1 goes on into iteration 2 instead of rebuilding.
  Publish(1, 0, 2);
  ASSERT_TRUE(WaitError());
  EXPECT_EQ(job_->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(job_->status().message()),
              HasSubstr("local rank 1 of job 'rebuild-unit' started "
                        "iteration 2 without rebuilding buckets"));
  // A switch requested now is answered with the job's error.
  auto result = RequestSwitch(*job_, 1, job_->spec().plan);
  ASSERT_TRUE(result->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(result->status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobRebuildTest, AStoppedJobAnswersAPendingSwitch) {
  size_t next = 0;
  RunIteration(2, 1, &next);
  // The engine never reaches iteration 5: the switch stays pending.
  auto result = RequestSwitch(*job_, 5, job_->spec().plan);
  EXPECT_FALSE(
      result->done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  job_.reset();
  ASSERT_TRUE(result->done.HasBeenNotified());
  EXPECT_EQ(result->status.code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace gradd
