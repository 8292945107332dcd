// The control loop's watchdog (engine/manager/loop_watchdog.h): JobManager
// pings from its control thread, so a hung control thread stops the pings.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/engine/manager/loop_watchdog.h"
#include "tests/unit/engine/manager/job_manager_fixture.h"

namespace gradd {
namespace {

TEST(LoopWatchdogTest, PingsAtOnceThenEveryInterval) {
  LoopWatchdog w;
  int pings = 0;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(w.next(), absl::InfiniteFuture());
  w.Tick(t0);
  EXPECT_EQ(pings, 0);  // not set: never pings

  w.Set([&] { ++pings; }, absl::Seconds(10));
  EXPECT_LE(w.next(), t0);
  w.Tick(t0);
  EXPECT_EQ(pings, 1);
  EXPECT_EQ(w.next(), t0 + absl::Seconds(10));
  w.Tick(t0 + absl::Seconds(9));
  EXPECT_EQ(pings, 1);
  w.Tick(t0 + absl::Seconds(10));
  EXPECT_EQ(pings, 2);
}

TEST(LoopWatchdogTest, InfiniteIntervalIsOff) {
  LoopWatchdog w;
  int pings = 0;
  w.Set([&] { ++pings; }, absl::InfiniteDuration());
  w.Tick(absl::Now());
  EXPECT_EQ(pings, 0);
  EXPECT_EQ(w.next(), absl::InfiniteFuture());
}

// Counts pings and the thread they came from.
struct PingLog {
  absl::Mutex mu;
  int count ABSL_GUARDED_BY(mu) = 0;
  std::thread::id thread ABSL_GUARDED_BY(mu);

  void Ping() {
    absl::MutexLock lock(&mu);
    ++count;
    thread = std::this_thread::get_id();
  }
  // Waits (bounded) until more than `n` pings arrived; the count then.
  int WaitBeyond(int n, absl::Duration limit) {
    absl::MutexLock lock(&mu);
    auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return count > n; };
    mu.AwaitWithTimeout(absl::Condition(&more), limit);
    return count;
  }
  int Count() {
    absl::MutexLock lock(&mu);
    return count;
  }
};

class JobWatchdogTest : public JobManagerFixture {};

TEST_F(JobWatchdogTest, PingsFromTheControlThreadAndStopsWhenItHangs) {
  PingLog log;
  manager().SetWatchdog([&log] { log.Ping(); }, absl::Milliseconds(5));
  // Idle (no jobs): the loop still wakes for the watchdog.
  ASSERT_GE(log.WaitBeyond(2, absl::Seconds(10)), 3);

  // Handler callbacks run on the control thread: block it in one.
  absl::Notification in_callback, release;
  std::thread::id control_thread;
  v1::DetachRequest unknown;
  unknown.set_job_id("nope");
  unknown.set_session_id(42);
  manager().HandleDetach(unknown, [&](absl::Status) {
    control_thread = std::this_thread::get_id();
    in_callback.Notify();
    release.WaitForNotification();
  });
  ASSERT_TRUE(in_callback.WaitForNotificationWithTimeout(absl::Seconds(10)));
  const int before = log.Count();
  {
    absl::MutexLock lock(&log.mu);
    EXPECT_EQ(log.thread, control_thread);
  }
  // 40 intervals without a ping while the control thread is stuck.
  EXPECT_EQ(log.WaitBeyond(before, absl::Milliseconds(200)), before);
  release.Notify();
  EXPECT_GT(log.WaitBeyond(before, absl::Seconds(10)), before);
}

}  // namespace
}  // namespace gradd
