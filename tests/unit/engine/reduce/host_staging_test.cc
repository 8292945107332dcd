// HostStaging (server/engine/reduce/host_staging.h) over a fake device whose
// "device memory" is host memory and whose copies run when the staging
// thread waits for them: the staged average, join subsets, hooks, buffer
// reuse, timeouts, device errors and stopping.
#include "server/engine/reduce/host_staging.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/reduce/bucket_reducer.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FakeStagingDevice final : public StagingDeviceInterface {
 public:
  absl::StatusOr<void*> AllocateHost(int rank, size_t bytes,
                                     absl::string_view context) override {
    absl::MutexLock lock(&mu_);
    if (fail_alloc_) return absl::ResourceExhaustedError(context);
    ++allocations_;
    void* p = std::malloc(bytes);
    std::memset(p, 0xab, bytes);
    return p;
  }
  void FreeHost(void* host) override {
    absl::MutexLock lock(&mu_);
    ++frees_;
    std::free(host);
  }
  absl::Status CopyToHost(int bucket, absl::Span<const Copy> copies,
                          absl::string_view context) override {
    absl::MutexLock lock(&mu_);
    if (fail_to_host_) {
      return absl::InternalError(absl::StrCat(context, " device 0: D2H"));
    }
    // Queued, as on a stream: they run when the staging thread waits.
    for (const Copy& c : copies) {
      pending_.push_back(c);
      to_host_ranks_.push_back(c.rank);
    }
    return absl::OkStatus();
  }
  absl::Status WaitForHost(int bucket, absl::Span<const Copy> copies,
                           absl::Time deadline,
                           absl::string_view context) override {
    absl::MutexLock lock(&mu_);
    ++waits_;
    auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !hold_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&go), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(context, ": stuck"));
    }
    for (const Copy& c : pending_) std::memcpy(c.host, c.device, c.bytes);
    pending_.clear();
    return absl::OkStatus();
  }
  absl::Status CopyToDevice(int bucket, absl::Span<const Copy> copies,
                            absl::string_view context) override {
    absl::MutexLock lock(&mu_);
    if (fail_to_device_) {
      return absl::InternalError(absl::StrCat(context, " device 0: H2D"));
    }
    for (const Copy& c : copies) {
      std::memcpy(c.device, c.host, c.bytes);
      to_device_ranks_.push_back(c.rank);
    }
    ++done_marks_;
    return absl::OkStatus();
  }
  absl::Status Drain(absl::Time deadline, absl::string_view context) override {
    absl::MutexLock lock(&mu_);
    ++drains_;
    drained_at_frees_ = frees_;
    if (fail_drain_) {
      return absl::DeadlineExceededError(absl::StrCat(context, ": stuck"));
    }
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_alloc_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_to_host_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_to_device_ ABSL_GUARDED_BY(mu_) = false;
  int allocations_ ABSL_GUARDED_BY(mu_) = 0;
  int frees_ ABSL_GUARDED_BY(mu_) = 0;
  int done_marks_ ABSL_GUARDED_BY(mu_) = 0;
  int waits_ ABSL_GUARDED_BY(mu_) = 0;  // WaitForHost calls entered
  bool fail_drain_ ABSL_GUARDED_BY(mu_) = false;
  int drains_ ABSL_GUARDED_BY(mu_) = 0;
  int drained_at_frees_ ABSL_GUARDED_BY(mu_) = -1;  // frees_ when drained
  std::vector<Copy> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<int> to_host_ranks_ ABSL_GUARDED_BY(mu_);
  std::vector<int> to_device_ranks_ ABSL_GUARDED_BY(mu_);
};

// Doubles every value in place (stands in for a hook: its result is not
// the average, so the test sees the hook's output come back).
class DoublingHook final : public CommHookInterface {
 public:
  absl::Status Run(const CommHookWork& work,
                   CollectiveBackendInterface&) override {
    for (void* b : *work.rank_buffers) {
      float* f = static_cast<float*>(b);
      for (size_t i = 0; i < work.count; ++i) f[i] *= 2;
    }
    return absl::OkStatus();
  }
  std::string name() const override { return "doubling"; }
};

class HostStagingTest : public ::testing::Test {
 protected:
  void Make(int world, absl::Duration timeout = absl::Seconds(10)) {
    host_ = std::make_unique<FusedReducer>(nullptr, world);
    HostStaging::Options o;
    o.job_id = "j";
    o.local_world_size = world;
    o.copy_timeout = timeout;
    staging_ = std::make_unique<HostStaging>(
        o, &device_, [this](const BucketWork& w, HostStaging::Completion d) {
          host_calls_.fetch_add(1);
          host_->Start(w, std::move(d));
        });
    ranks_.assign(world, std::vector<float>(kCount));
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < kCount; ++i) ranks_[r][i] = (r + 1) * 1.0f + i;
      buffers_.push_back(ranks_[r].data());
    }
  }
  BucketWork Work(const std::vector<void*>* buffers, int bucket = 0) {
    BucketWork w;
    w.bucket = bucket;
    w.iteration = 1;
    w.dtype = DType::kFloat32;
    w.count = kCount;
    w.device = DeviceKind::kCuda;
    w.rank_buffers = buffers;
    return w;
  }
  // Starts `w` and waits (bounded) for its completion.
  absl::Status Run(const BucketWork& w) {
    absl::Notification n;
    absl::Status out;
    staging_->Start(w, [&](absl::Status s) {
      out = s;
      n.Notify();
    });
    if (!n.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return absl::DeadlineExceededError("no completion");
    }
    return out;
  }

  static constexpr size_t kCount = 100;
  FakeStagingDevice device_;
  std::unique_ptr<FusedReducer> host_;
  std::atomic<int> host_calls_{0};
  std::unique_ptr<HostStaging> staging_;
  std::vector<std::vector<float>> ranks_;
  std::vector<void*> buffers_;
};

TEST_F(HostStagingTest, AveragesThroughHostAndWritesEveryRankBack) {
  Make(3);
  ASSERT_TRUE(Run(Work(&buffers_)).ok());
  for (int r = 0; r < 3; ++r) {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(ranks_[r][i], 2.0f + i) << "rank " << r << " element " << i;
    }
  }
  absl::MutexLock lock(&device_.mu_);
  EXPECT_THAT(device_.to_host_ranks_, ElementsAre(0, 1, 2));
  EXPECT_THAT(device_.to_device_ranks_, ElementsAre(0, 1, 2));
  EXPECT_EQ(device_.done_marks_, 1);
  EXPECT_EQ(host_calls_.load(), 1);
}

TEST_F(HostStagingTest, JoinCopiesOnlyTheActiveRanksWithTheRoundsDivisor) {
  Make(3);
  std::vector<void*> active = {buffers_[0], buffers_[2]};
  std::vector<int> ranks = {0, 2};
  BucketWork w = Work(&active);
  w.ranks = &ranks;
  w.divisor = 3;  // divide_by_initial_world_size
  ASSERT_TRUE(Run(w).ok());
  for (size_t i = 0; i < kCount; ++i) {
    const float avg = (1.0f + i + 3.0f + i) / 3;
    ASSERT_FLOAT_EQ(ranks_[0][i], avg);
    ASSERT_FLOAT_EQ(ranks_[2][i], avg);
    ASSERT_EQ(ranks_[1][i], 2.0f + i) << "the joined rank was written";
  }
  absl::MutexLock lock(&device_.mu_);
  EXPECT_THAT(device_.to_host_ranks_, ElementsAre(0, 2));
  EXPECT_THAT(device_.to_device_ranks_, ElementsAre(0, 2));
}

TEST_F(HostStagingTest, NoActiveRankStillRunsTheHostReducer) {
  Make(2);
  std::vector<void*> none;
  std::vector<int> ranks;
  BucketWork w = Work(&none);
  w.ranks = &ranks;
  EXPECT_TRUE(Run(w).ok());
  EXPECT_EQ(host_calls_.load(), 1);
}

TEST_F(HostStagingTest, AHookRunsOnTheStagingAndItsResultComesBack) {
  Make(2);
  ASSERT_TRUE(host_->SetCommHook(std::make_unique<DoublingHook>()).ok());
  ASSERT_TRUE(Run(Work(&buffers_)).ok());
  EXPECT_EQ(ranks_[0][5], 2 * (1.0f + 5));
  EXPECT_EQ(ranks_[1][5], 2 * (2.0f + 5));
}

TEST_F(HostStagingTest, BuffersAreReusedAndRemadeAfterAReplan) {
  Make(2);
  ASSERT_TRUE(Run(Work(&buffers_)).ok());
  ASSERT_TRUE(Run(Work(&buffers_)).ok());
  EXPECT_EQ(staging_->host_bytes(), 2 * kCount * sizeof(float));
  {
    absl::MutexLock lock(&device_.mu_);
    EXPECT_EQ(device_.allocations_, 2);
  }
  ASSERT_TRUE(staging_->Replan().ok());
  EXPECT_EQ(staging_->host_bytes(), 0u);
  {
    // The copies back were drained before any buffer was freed.
    absl::MutexLock lock(&device_.mu_);
    EXPECT_EQ(device_.drains_, 1);
    EXPECT_EQ(device_.drained_at_frees_, 0);
  }
  ASSERT_TRUE(Run(Work(&buffers_, /*bucket=*/1)).ok());
  absl::MutexLock lock(&device_.mu_);
  EXPECT_EQ(device_.allocations_, 4);
  EXPECT_EQ(device_.frees_, 2);
}

TEST_F(HostStagingTest, AReplanBeforeAnyStagingHasNothingToDrain) {
  Make(2);
  ASSERT_TRUE(staging_->Replan().ok());
  absl::MutexLock lock(&device_.mu_);
  EXPECT_EQ(device_.drains_, 0);
}

// Copies back that never finish: the buffers they read are kept, and the
// staging refuses further work with the reason instead of reusing them.
TEST_F(HostStagingTest, AFailedDrainKeepsTheBuffersAndFailsLaterBuckets) {
  Make(2);
  ASSERT_TRUE(Run(Work(&buffers_)).ok());
  {
    absl::MutexLock lock(&device_.mu_);
    device_.fail_drain_ = true;
  }
  absl::Status s = staging_->Replan();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("job 'j' bucket rebuild: stuck"));
  EXPECT_EQ(staging_->host_bytes(), 2 * kCount * sizeof(float));
  {
    absl::MutexLock lock(&device_.mu_);
    EXPECT_EQ(device_.frees_, 0);
  }
  absl::Status later = Run(Work(&buffers_, /*bucket=*/1));
  EXPECT_EQ(later.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(later.message(),
              AllOf(HasSubstr("job 'j' bucket 1 iteration 1"),
                    HasSubstr("host staging unusable after the plan changed")));
  EXPECT_EQ(host_calls_.load(), 1);
  // A second Replan reports the same, still without freeing.
  EXPECT_EQ(staging_->Replan().code(), absl::StatusCode::kDeadlineExceeded);
  staging_.reset();  // frees them now
  absl::MutexLock lock(&device_.mu_);
  EXPECT_EQ(device_.frees_, 2);
  EXPECT_EQ(device_.drains_, 1);
}

TEST_F(HostStagingTest, CopiesThatNeverLandTimeOutNamingTheBucket) {
  Make(2, absl::Milliseconds(50));
  {
    absl::MutexLock lock(&device_.mu_);
    device_.hold_ = true;
  }
  BucketWork w = Work(&buffers_, 4);
  w.iteration = 9;
  absl::Status s = Run(w);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("job 'j'"), HasSubstr("bucket 4"),
                                 HasSubstr("iteration 9")));
  EXPECT_EQ(host_calls_.load(), 0);
}

TEST_F(HostStagingTest, DeviceErrorsReachTheCompletion) {
  Make(2);
  {
    absl::MutexLock lock(&device_.mu_);
    device_.fail_to_host_ = true;
  }
  absl::Status s = Run(Work(&buffers_));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("bucket 0"), HasSubstr("D2H")));
  {
    absl::MutexLock lock(&device_.mu_);
    device_.fail_to_host_ = false;
    device_.fail_to_device_ = true;
  }
  s = Run(Work(&buffers_));
  EXPECT_THAT(s.message(), HasSubstr("H2D"));
  {
    absl::MutexLock lock(&device_.mu_);
    device_.fail_to_device_ = false;
    device_.fail_alloc_ = true;
  }
  s = Run(Work(&buffers_, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("local rank 0: host staging"));
}

TEST_F(HostStagingTest, BadRankListsAreInternalErrors) {
  Make(2);
  std::vector<int> ranks = {0};
  BucketWork w = Work(&buffers_);
  w.ranks = &ranks;
  EXPECT_EQ(Run(w).code(), absl::StatusCode::kInternal);
  std::vector<int> out_of_range = {0, 7};
  w.ranks = &out_of_range;
  absl::Status s = Run(w);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("local rank 7"));
}

TEST_F(HostStagingTest, StopCancelsQueuedBucketsAndLaterStarts) {
  Make(2, absl::Seconds(30));
  {
    absl::MutexLock lock(&device_.mu_);
    device_.hold_ = true;  // the first bucket sits in WaitForHost
  }
  absl::Mutex mu;
  std::vector<absl::Status> results(2);
  int completed = 0;
  for (int b = 0; b < 2; ++b) {
    staging_->Start(Work(&buffers_, b), [&, b](absl::Status s) {
      absl::MutexLock lock(&mu);
      results[b] = s;
      ++completed;
    });
  }
  {
    // The staging thread has taken bucket 0 and waits for its copies.
    absl::MutexLock lock(&device_.mu_);
    auto waiting = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(device_.mu_) {
      return device_.waits_ == 1;
    };
    ASSERT_TRUE(device_.mu_.AwaitWithTimeout(absl::Condition(&waiting),
                                             absl::Seconds(10)));
  }
  std::thread stopper([&] { staging_->Stop(); });
  // Once Stop has been asked for, Start completes inline with CANCELLED;
  // probes that still queue are cancelled with the rest.
  struct Probe {
    bool returned = false;
    bool inline_cancel = false;
  };
  std::vector<std::unique_ptr<Probe>> probes;  // outlive their completions
  bool stopped = false;
  const absl::Time limit = absl::Now() + absl::Seconds(10);
  while (!stopped && absl::Now() < limit) {
    probes.push_back(std::make_unique<Probe>());
    Probe* p = probes.back().get();
    staging_->Start(Work(&buffers_, 2), [&, p](absl::Status s) {
      absl::MutexLock lock(&mu);
      if (!p->returned) {
        p->inline_cancel = s.code() == absl::StatusCode::kCancelled;
      }
      ++completed;
    });
    absl::MutexLock lock(&mu);
    p->returned = true;
    stopped = p->inline_cancel;
  }
  ASSERT_TRUE(stopped);
  {
    absl::MutexLock lock(&device_.mu_);
    device_.hold_ = false;
  }
  stopper.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(completed, 2 + static_cast<int>(probes.size()));
  EXPECT_TRUE(results[0].ok()) << results[0];  // the thread had taken it
  EXPECT_EQ(results[1].code(), absl::StatusCode::kCancelled) << results[1];
  EXPECT_THAT(results[1].message(), HasSubstr("bucket 1"));
}

}  // namespace
}  // namespace gradd
