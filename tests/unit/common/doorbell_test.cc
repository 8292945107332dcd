#include "common/doorbell.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/status/status.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/shm.h"
#include "gtest/gtest.h"

namespace gradd {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// A job's control state as the daemon creates it: the job block (sealed
// read-only once mapped), the rank blocks and the bells, the daemon's
// mapping and its doorbell; rank(r) maps what a trainer of rank r gets.
struct Block {
  // cpus: the cores the daemon's doorbell counts (0: this machine's).
  explicit Block(uint32_t world = 2, uint32_t buckets = 4, int cpus = 0)
      : layout(world, buckets) {
    job_fd = *CreateMemfdForSealing("doorbell-test", layout.job_bytes());
    std::vector<int> blocks, reads;
    for (uint32_t r = 0; r < world; ++r) {
      rank_fds.push_back(
          *CreateSealedMemfd("doorbell-rank", layout.rank_block_bytes()));
      blocks.push_back(rank_fds.back().get());
      bells.push_back(*CreateBell());
      reads.push_back(bells.back().read_end.get());
    }
    auto map_or = ControlMapping::Map(layout, job_fd.get(), true, blocks);
    EXPECT_TRUE(map_or.ok()) << map_or.status();
    map = std::move(*map_or);
    EXPECT_TRUE(SealReadOnlyForOthers(job_fd.get()).ok());
    layout.Initialize(map.data());
    doorbell = *DaemonDoorbell::Create(layout, map.data(), reads, cpus);
  }
  ControlHeader* header() const { return layout.header(map.data()); }
  RankHeader* rank_header(uint32_t r) const {
    return layout.rank_header(map.data(), r);
  }
  // A trainer's mapping of rank r (job block read-only).
  ControlMapping rank(uint32_t r) const {
    auto m =
        ControlMapping::MapRank(layout, job_fd.get(), r, rank_fds[r].get());
    EXPECT_TRUE(m.ok()) << m.status();
    return std::move(*m);
  }
  int bell(uint32_t r) const { return bells[r].write_end.get(); }

  ControlLayout layout;
  UniqueFd job_fd;
  std::vector<UniqueFd> rank_fds;
  std::vector<BellPipe> bells;
  ControlMapping map;
  std::unique_ptr<DaemonDoorbell> doorbell;
};

// The daemon side of a one-rank, one-bucket job: waits for the doorbell,
// answers every ready_seq with the same done_seq. Returns how many it served
// (fewer when a wait ran into its 10 s bound: a lost wake-up).
int ServeIterations(const ControlLayout& layout, void* base,
                    DaemonDoorbell* bell, int iterations, nanoseconds spin) {
  uint64_t done = 0;
  while (done < static_cast<uint64_t>(iterations)) {
    bell->Snapshot();
    uint64_t ready =
        layout.ready_row(base, 0)[0].load(std::memory_order_acquire);
    if (ready == done + 1) {
      layout.done_seq(base)[0].store(ready, std::memory_order_release);
      done = ready;
      WakeClients(layout, base);
      continue;
    }
    auto start = steady_clock::now();
    bell->Wait(spin, seconds(10));
    if (steady_clock::now() - start >= seconds(9)) {
      return static_cast<int>(done);
    }
  }
  return static_cast<int>(done);
}

// The client side of rank 0: publish, ring, wait; false if any wait timed
// out.
bool RunClient(const ControlLayout& layout, void* base, int bell_fd,
               int iterations, nanoseconds spin) {
  ControlHeader* h = layout.header(base);
  RankHeader* me = layout.rank_header(base, 0);
  for (int i = 1; i <= iterations; ++i) {
    layout.ready_row(base, 0)[0].store(i, std::memory_order_release);
    RingDaemon(h, me, bell_fd);
    auto* done = &layout.done_seq(base)[0];
    bool ok = WaitForDaemon(
        h, me,
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
  ControlMapping client = block.rank(0);
  std::thread daemon([&] {
    served = ServeIterations(block.layout, block.map.data(),
                             block.doorbell.get(), kIterations, spin);
  });
  EXPECT_TRUE(
      RunClient(block.layout, client.data(), block.bell(0), kIterations, spin));
  daemon.join();
  EXPECT_EQ(served, kIterations);
  EXPECT_EQ(block.rank_header(0)->sleeping.load(), 0u);
  EXPECT_EQ(block.header()->daemon_sleeping.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Spin, DoorbellSpinTest, ::testing::Values(0, 50));

TEST(DoorbellTest, CrossProcessWakeupsThroughReadOnlyMapping) {
  Block block;
  constexpr int kIterations = 2000;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The trainer: its own mapping at another address, the job block
    // read-only; the futex on done_gen must be keyed by the file.
    auto m = ControlMapping::MapRank(block.layout, block.job_fd.get(), 0,
                                     block.rank_fds[0].get());
    if (!m.ok()) _exit(3);
    bool ok = RunClient(block.layout, m->data(), block.bell(0), kIterations,
                        nanoseconds(0));
    _exit(ok ? 0 : 2);
  }
  int served =
      ServeIterations(block.layout, block.map.data(), block.doorbell.get(),
                      kIterations, nanoseconds(0));
  EXPECT_EQ(served, kIterations);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(DoorbellTest, WaitForDaemonTimesOut) {
  Block block;
  auto start = steady_clock::now();
  bool ok = WaitForDaemon(
      block.header(), block.rank_header(0), [] { return false; },
      std::chrono::microseconds(100), milliseconds(60));
  auto waited = steady_clock::now() - start;
  EXPECT_FALSE(ok);
  EXPECT_GE(waited, milliseconds(55));
  EXPECT_LT(waited, seconds(3));
  EXPECT_EQ(block.rank_header(0)->sleeping.load(), 0u);
}

TEST(DoorbellTest, WaitForDaemonReturnsTrueAtOnceWhenReady) {
  Block block;
  EXPECT_TRUE(WaitForDaemon(
      block.header(), block.rank_header(0), [] { return true; }, nanoseconds(0),
      nanoseconds(0)));
}

TEST(DoorbellTest, WaitForDaemonReturnsPromptlyOnError) {
  Block block;
  std::thread daemon([&] {
    std::this_thread::sleep_for(milliseconds(30));
    PublishError(block.layout, block.map.data(), absl::StatusCode::kUnavailable,
                 "rank 1 of job j disconnected");
  });
  auto start = steady_clock::now();
  bool ok = WaitForDaemon(
      block.header(), block.rank_header(0), [] { return false; },
      nanoseconds(0), seconds(30));
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
      block.header(), block.rank_header(0), [] { return false; },
      milliseconds(1), seconds(30)));
  EXPECT_LT(steady_clock::now() - start, seconds(1));
}

TEST(DoorbellTest, DaemonWaitTimesOutAndSeesRings) {
  Block block;
  ControlMapping client = block.rank(1);
  DaemonDoorbell* bell = block.doorbell.get();
  bell->Snapshot();
  auto start = steady_clock::now();
  bell->Wait(std::chrono::microseconds(10), milliseconds(40));
  EXPECT_GE(steady_clock::now() - start, milliseconds(35));
  EXPECT_EQ(block.header()->daemon_sleeping.load(), 0u);

  std::thread rank([&] {
    std::this_thread::sleep_for(milliseconds(20));
    RingDaemon(block.layout.header(client.data()),
               block.layout.rank_header(client.data(), 1), block.bell(1));
  });
  start = steady_clock::now();
  bell->Wait(nanoseconds(0), seconds(30));
  EXPECT_LT(steady_clock::now() - start, seconds(5));
  rank.join();
  // Already moved since the snapshot: returns without waiting.
  start = steady_clock::now();
  bell->Wait(nanoseconds(0), seconds(30));
  EXPECT_LT(steady_clock::now() - start, seconds(5));

  // A daemon thread's ring.
  bell->Snapshot();
  std::thread daemon_thread([&] {
    std::this_thread::sleep_for(milliseconds(20));
    bell->Ring();
  });
  start = steady_clock::now();
  bell->Wait(nanoseconds(0), seconds(30));
  EXPECT_LT(steady_clock::now() - start, seconds(5));
  daemon_thread.join();
}

TEST(EngineSpinTest, CapsTheSpinOnlyWhenTheRanksLeaveNoCoreFree) {
  const nanoseconds configured = std::chrono::microseconds(50);
  // A core for every rank and one more: the configured spin.
  EXPECT_EQ(EngineSpin(configured, 2, 3), configured);
  EXPECT_EQ(EngineSpin(configured, 1, 16), configured);
  // As many ranks as cores, or more: capped.
  EXPECT_EQ(EngineSpin(configured, 2, 2), kCrowdedSpin);
  EXPECT_EQ(EngineSpin(configured, 8, 2), kCrowdedSpin);
  // A shorter configured spin stays; an unknown core count is not crowded.
  EXPECT_EQ(EngineSpin(std::chrono::microseconds(3), 2, 2),
            std::chrono::microseconds(3));
  EXPECT_EQ(EngineSpin(nanoseconds(0), 2, 1), nanoseconds(0));
  EXPECT_EQ(EngineSpin(configured, 2, 0), configured);
}

TEST(EngineSpinTest, UsableCpusCountsThisProcessCores) {
  EXPECT_GE(UsableCpus(), 1);
}

// The doorbell's wait with a spin far longer than the test: on a crowded
// node (2 ranks, 1 core) it must go to sleep in poll (daemon_sleeping
// raised) after the short crowded spin; with cores to spare it keeps
// spinning (never raises the flag) until the ring.
void WaitWithLongSpin(int cpus, bool expect_sleep) {
  Block block(2, 4, cpus);
  ControlMapping client = block.rank(0);
  DaemonDoorbell* bell = block.doorbell.get();
  bell->Snapshot();
  std::thread engine([&] { bell->Wait(seconds(60), seconds(60)); });
  bool slept = false;
  const auto until =
      steady_clock::now() + (expect_sleep ? seconds(20) : milliseconds(300));
  while (steady_clock::now() < until && !slept) {
    slept = block.header()->daemon_sleeping.load() != 0;
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(slept, expect_sleep) << "cpus " << cpus;
  RingDaemon(block.layout.header(client.data()),
             block.layout.rank_header(client.data(), 0), block.bell(0));
  engine.join();
  EXPECT_EQ(block.header()->daemon_sleeping.load(), 0u);
}

TEST(EngineSpinTest, ACrowdedEngineSleepsInsteadOfSpinning) {
  WaitWithLongSpin(/*cpus=*/1, /*expect_sleep=*/true);
}

TEST(EngineSpinTest, AnEngineWithACoreToSpareSpins) {
  WaitWithLongSpin(/*cpus=*/64, /*expect_sleep=*/false);
}

// The calling thread pinned to the CPU it runs on, for as long as this
// lives, so that doorbell_internal::CpuHint() stays what cpu() says.
class PinHere {
 public:
  PinHere() {
    sched_getaffinity(0, sizeof(saved_), &saved_);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    pinned_ = sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~PinHere() { sched_setaffinity(0, sizeof(saved_), &saved_); }
  bool pinned() const { return pinned_; }
  uint32_t cpu() const { return doorbell_internal::CpuHint(); }

 private:
  cpu_set_t saved_;
  bool pinned_ = false;
};

TEST(StandDownTest, RingDaemonRecordsTheRanksCpu) {
  Block block;
  ControlMapping client = block.rank(0);
  PinHere pin;
  ASSERT_TRUE(pin.pinned());
  ASSERT_NE(pin.cpu(), 0u);
  RingDaemon(block.layout.header(client.data()),
             block.layout.rank_header(client.data(), 0), block.bell(0));
  EXPECT_EQ(block.rank_header(0)->cpu.load(), pin.cpu());
}

// A wait with a spin far longer than the test, on a thread pinned to one
// CPU, while the job's stand_down_cpu names that CPU (`here`) or another:
// asked, the waiter sleeps at once (its sleeping flag goes up); otherwise
// it keeps spinning (no flag within 300 ms). `rank`: a trainer's
// WaitForDaemon, else the engine's DaemonDoorbell::Wait (with cores to
// spare, so that only the hint can cut its spin).
void WaitWhileAskedToStandDown(bool rank, bool here) {
  Block block(2, 4, /*cpus=*/64);
  ControlMapping client = block.rank(0);
  const ControlHeader* h = block.layout.header(client.data());
  RankHeader* me = block.layout.rank_header(client.data(), 0);
  std::atomic<uint32_t> waiter_cpu{0};
  std::atomic<bool> release{false};
  std::thread waiter([&] {
    PinHere pin;
    ASSERT_TRUE(pin.pinned());
    block.header()->stand_down_cpu.store(here ? pin.cpu() : pin.cpu() + 1000);
    waiter_cpu = pin.cpu();
    if (rank) {
      EXPECT_TRUE(WaitForDaemon(
          h, me, [&] { return release.load(); }, seconds(60), seconds(60)));
    } else {
      block.doorbell->Snapshot();
      block.doorbell->Wait(seconds(60), seconds(60));
    }
  });
  auto sleeping = [&] {
    return rank ? block.rank_header(0)->sleeping.load() != 0
                : block.header()->daemon_sleeping.load() != 0;
  };
  bool slept = false;
  const auto until =
      steady_clock::now() + (here ? seconds(20) : milliseconds(300));
  while (steady_clock::now() < until && !slept) {
    slept = waiter_cpu.load() != 0 && sleeping();
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(slept, here) << (rank ? "rank" : "engine");
  release = true;
  if (rank) {
    WakeClients(block.layout, block.map.data());
  } else {
    RingDaemon(h, me, block.bell(0));
  }
  waiter.join();
}

TEST(StandDownTest, ARankAskedToStandDownSleepsAtOnce) {
  WaitWhileAskedToStandDown(/*rank=*/true, /*here=*/true);
}

TEST(StandDownTest, ARankSpinsWhenTheHintNamesAnotherCpu) {
  WaitWhileAskedToStandDown(/*rank=*/true, /*here=*/false);
}

TEST(StandDownTest, AnEngineAskedToStandDownSleepsAtOnce) {
  WaitWhileAskedToStandDown(/*rank=*/false, /*here=*/true);
}

TEST(StandDownTest, AnEngineSpinsWhenTheHintNamesAnotherCpu) {
  WaitWhileAskedToStandDown(/*rank=*/false, /*here=*/false);
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
