#include "common/doorbell.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "common/control_block.h"
#include "common/shm.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// A control block in a sealed memfd, as the daemon creates it.
struct Block {
  explicit Block(uint32_t world = 2, uint32_t buckets = 4)
      : layout(world, buckets) {
    auto fd_or = CreateSealedMemfd("doorbell-test", layout.total_bytes());
    EXPECT_TRUE(fd_or.ok());
    fd = std::move(*fd_or);
    auto map_or = Mapping::Map(fd.get(), layout.total_bytes());
    EXPECT_TRUE(map_or.ok());
    map = std::move(*map_or);
    layout.Initialize(map.data());
  }
  ControlHeader* header() const { return layout.header(map.data()); }

  ControlLayout layout;
  UniqueFd fd;
  Mapping map;
};

// The daemon side of a one-rank, one-bucket job: waits for the doorbell,
// answers every ready_seq with the same done_seq. Returns how many it served.
int ServeIterations(const ControlLayout& layout, void* base, int iterations,
                    nanoseconds spin) {
  ControlHeader* h = layout.header(base);
  uint32_t seen = h->doorbell.load(std::memory_order_acquire);
  uint64_t done = 0;
  while (done < static_cast<uint64_t>(iterations)) {
    uint64_t ready =
        layout.ready_row(base, 0)[0].load(std::memory_order_acquire);
    if (ready == done + 1) {
      layout.done_seq(base)[0].store(ready, std::memory_order_release);
      done = ready;
      WakeClients(h);
      continue;
    }
    uint32_t now = WaitDoorbell(h, seen, spin, seconds(10));
    if (now == seen) return static_cast<int>(done);  // timed out: a lost wake
    seen = now;
  }
  return static_cast<int>(done);
}

// The client side: publish, ring, wait; false if any wait timed out.
bool RunClient(const ControlLayout& layout, void* base, int iterations,
               nanoseconds spin) {
  ControlHeader* h = layout.header(base);
  for (int i = 1; i <= iterations; ++i) {
    layout.ready_row(base, 0)[0].store(i, std::memory_order_release);
    RingDaemon(h);
    auto* done = &layout.done_seq(base)[0];
    bool ok = WaitForDaemon(
        h,
        [&] {
          return done->load(std::memory_order_acquire) >=
                 static_cast<uint64_t>(i);
        },
        spin, seconds(10));
    if (!ok) return false;
  }
  return true;
}

class DoorbellSpinTest : public ::testing::TestWithParam<int> {};

// Both sides sleep on futexes every time (spin 0) or mostly spin (50 us):
// thousands of round trips must complete, none lost.
TEST_P(DoorbellSpinTest, CrossThreadPingPongLosesNoWakeups) {
  Block block;
  const nanoseconds spin = std::chrono::microseconds(GetParam());
  constexpr int kIterations = 3000;
  int served = 0;
  std::thread daemon([&] {
    served = ServeIterations(block.layout, block.map.data(), kIterations, spin);
  });
  EXPECT_TRUE(RunClient(block.layout, block.map.data(), kIterations, spin));
  daemon.join();
  EXPECT_EQ(served, kIterations);
  EXPECT_EQ(block.header()->sleepers.load(), 0u);
  EXPECT_EQ(block.header()->daemon_sleeping.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Spin, DoorbellSpinTest, ::testing::Values(0, 50));

TEST(DoorbellTest, CrossProcessWakeupsThroughSharedFutex) {
  Block block;
  constexpr int kIterations = 2000;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A second mapping at a different address, as a separate daemon process
    // would have: the futex must be keyed by the file, not the address.
    auto m = Mapping::Map(block.fd.get(), block.layout.total_bytes());
    if (!m.ok()) _exit(3);
    int served =
        ServeIterations(block.layout, m->data(), kIterations, nanoseconds(0));
    _exit(served == kIterations ? 0 : 2);
  }
  auto m = Mapping::Map(block.fd.get(), block.layout.total_bytes());
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(RunClient(block.layout, m->data(), kIterations, nanoseconds(0)));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(DoorbellTest, WaitForDaemonTimesOut) {
  Block block;
  auto start = steady_clock::now();
  bool ok = WaitForDaemon(
      block.header(), [] { return false; }, std::chrono::microseconds(100),
      milliseconds(60));
  auto waited = steady_clock::now() - start;
  EXPECT_FALSE(ok);
  EXPECT_GE(waited, milliseconds(55));
  EXPECT_LT(waited, seconds(3));
  EXPECT_EQ(block.header()->sleepers.load(), 0u);
}

TEST(DoorbellTest, WaitForDaemonReturnsTrueAtOnceWhenReady) {
  Block block;
  EXPECT_TRUE(WaitForDaemon(
      block.header(), [] { return true; }, nanoseconds(0), nanoseconds(0)));
}

TEST(DoorbellTest, WaitForDaemonReturnsPromptlyOnError) {
  Block block;
  std::thread daemon([&] {
    std::this_thread::sleep_for(milliseconds(30));
    PublishError(block.header(), absl::StatusCode::kUnavailable,
                 "rank 1 of job j disconnected");
  });
  auto start = steady_clock::now();
  bool ok = WaitForDaemon(
      block.header(), [] { return false; }, nanoseconds(0), seconds(30));
  auto waited = steady_clock::now() - start;
  daemon.join();
  EXPECT_FALSE(ok);
  EXPECT_LT(waited, seconds(5));
  absl::Status error = ReadError(block.header());
  EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(error.message(), "rank 1 of job j disconnected");

  // Once failed, later waits return false immediately.
  start = steady_clock::now();
  EXPECT_FALSE(WaitForDaemon(
      block.header(), [] { return false; }, milliseconds(1), seconds(30)));
  EXPECT_LT(steady_clock::now() - start, seconds(1));
}

TEST(DoorbellTest, WaitDoorbellTimesOutAndSeesRings) {
  Block block;
  ControlHeader* h = block.header();
  auto start = steady_clock::now();
  EXPECT_EQ(WaitDoorbell(h, 0, std::chrono::microseconds(10), milliseconds(40)),
            0u);
  EXPECT_GE(steady_clock::now() - start, milliseconds(35));
  EXPECT_EQ(h->daemon_sleeping.load(), 0u);

  std::thread client([&] {
    std::this_thread::sleep_for(milliseconds(20));
    RingDaemon(h);
  });
  start = steady_clock::now();
  EXPECT_EQ(WaitDoorbell(h, 0, nanoseconds(0), seconds(30)), 1u);
  EXPECT_LT(steady_clock::now() - start, seconds(5));
  client.join();
  // Already past `seen`: returns without waiting.
  EXPECT_EQ(WaitDoorbell(h, 0, nanoseconds(0), seconds(30)), 1u);
}

TEST(DoorbellTest, FutexWaitReturnsWhenValueDiffers) {
  std::atomic<uint32_t> word{7};
  auto start = steady_clock::now();
  FutexWait(&word, 6, seconds(10));  // 7 != 6: returns at once
  EXPECT_LT(steady_clock::now() - start, seconds(1));
  FutexWait(&word, 7, milliseconds(20));  // times out
  EXPECT_GE(steady_clock::now() - start, milliseconds(15));
}

}  // namespace
}  // namespace gradd
