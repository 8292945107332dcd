// What a rogue rank can do to the wake-ups of the others (issue 11): it
// writes only its own rank block and its own bell, and nothing it writes
// there may hide another rank's ring or wake-up.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <thread>

#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/shm.h"
#include "gtest/gtest.h"
#include "tests/unit/common/write_fault.h"

namespace gradd {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

// The daemon's side of a two-rank job (see doorbell_test.cc's Block).
struct Job {
  Job() : layout(2, 4) {
    job_fd = *CreateMemfdForSealing("iso-test", layout.job_bytes());
    std::vector<int> blocks, reads;
    for (uint32_t r = 0; r < 2; ++r) {
      rank_fds.push_back(
          *CreateSealedMemfd("iso-rank", layout.rank_block_bytes()));
      blocks.push_back(rank_fds.back().get());
      bells.push_back(*CreateBell());
      reads.push_back(bells.back().read_end.get());
    }
    map = *ControlMapping::Map(layout, job_fd.get(), true, blocks);
    EXPECT_TRUE(SealReadOnlyForOthers(job_fd.get()).ok());
    layout.Initialize(map.data());
    doorbell = *DaemonDoorbell::Create(layout, map.data(), reads);
  }
  ControlMapping Rank(uint32_t r) {
    return *ControlMapping::MapRank(layout, job_fd.get(), r, rank_fds[r].get());
  }

  ControlLayout layout;
  UniqueFd job_fd;
  std::vector<UniqueFd> rank_fds;
  std::vector<BellPipe> bells;
  ControlMapping map;
  std::unique_ptr<DaemonDoorbell> doorbell;
};

TEST(ControlIsolationTest, JobBlockIsReadOnlyForTrainers) {
  Job job;
  const int fd = job.job_fd.get();
  const size_t n = job.layout.job_bytes();
  // No writable mapping, no write(), no way to upgrade a read-only one.
  errno = 0;
  EXPECT_EQ(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  void* ro = mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  errno = 0;
  EXPECT_NE(mprotect(ro, n, PROT_READ | PROT_WRITE), 0);
  EXPECT_EQ(errno, EACCES);
  munmap(ro, n);
  const int32_t evil = 1;
  errno = 0;
  EXPECT_LT(pwrite(fd, &evil, sizeof(evil), offsetof(ControlHeader, status)),
            0);
  EXPECT_EQ(errno, EPERM);
  // Reopening through /proc does not lift the seal (it is the inode's).
  UniqueFd again(open(("/proc/self/fd/" + std::to_string(fd)).c_str(),
                      O_RDWR | O_CLOEXEC));
  if (again.valid()) {
    EXPECT_EQ(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, again.get(), 0),
        MAP_FAILED);
  }
  // The sealing cannot be undone or extended to trap the daemon.
  EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
  // Status and error stay what the daemon wrote.
  EXPECT_EQ(job.layout.header(job.map.data())->status.load(), 0);
}

TEST(ControlIsolationTest, TrainerMappingHoldsOnlyItsOwnRankBlock) {
  Job job;
  ControlMapping rank1 = job.Rank(1);
  // Its own block is writable, the job block readable.
  job.layout.ready_row(rank1.data(), 1)[0].store(5);
  EXPECT_EQ(job.layout.ready_row(job.map.data(), 1)[0].load(), 5u);
  EXPECT_EQ(job.layout.header(rank1.data())->magic, kControlMagic);
  // Rank 0's block is not in rank 1's range: touching it faults.
  job.layout.ready_row(job.map.data(), 0)[0].store(9);
  auto* other = job.layout.ready_row(rank1.data(), 0);
  EXPECT_EXIT(other[0].store(1), ::gradd::testing::DiedOfWriteFault,
              ::gradd::testing::kWriteFaultOutput);
  EXPECT_EQ(job.layout.ready_row(job.map.data(), 0)[0].load(), 9u);
  // A write-only bell: the rank cannot drain (or read) the daemon's end.
  char c;
  errno = 0;
  EXPECT_LT(read(job.bells[1].write_end.get(), &c, 1), 0);
  EXPECT_EQ(errno, EBADF);
}

// Rank 1 moves its doorbell word backwards exactly as rank 0 rings: a
// daemon that summed the words would miss rank 0.
TEST(ControlIsolationTest, RogueDoorbellCannotCancelAnotherRanksRing) {
  Job job;
  ControlMapping rank0 = job.Rank(0);
  ControlMapping rank1 = job.Rank(1);
  DaemonDoorbell* bell = job.doorbell.get();
  bell->Snapshot();
  job.layout.rank_header(rank1.data(), 1)->doorbell.fetch_sub(1);
  RingDaemon(job.layout.header(rank0.data()),
             job.layout.rank_header(rank0.data(), 0),
             job.bells[0].write_end.get());
  auto start = steady_clock::now();
  bell->Wait(nanoseconds(0), seconds(30));
  EXPECT_LT(steady_clock::now() - start, seconds(5));
}

// While the daemon sleeps, rank 1 zeroes its words and closes its bell;
// rank 0's ring still wakes it (poll set, not a futex word rank 1 writes),
// and a closed bell does not turn the sleep into a busy loop forever.
TEST(ControlIsolationTest, RogueCannotStallTheDaemonsSleep) {
  Job job;
  ControlMapping rank0 = job.Rank(0);
  ControlMapping rank1 = job.Rank(1);
  DaemonDoorbell* bell = job.doorbell.get();
  RankHeader* rogue = job.layout.rank_header(rank1.data(), 1);
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    job.bells[1].write_end.reset();
    while (!stop.load()) {
      rogue->doorbell.store(0);
      rogue->sleeping.store(0);
    }
  });
  for (int i = 0; i < 20; ++i) {
    bell->Snapshot();
    std::thread honest([&] {
      std::this_thread::sleep_for(milliseconds(2));
      RingDaemon(job.layout.header(rank0.data()),
                 job.layout.rank_header(rank0.data(), 0),
                 job.bells[0].write_end.get());
    });
    auto start = steady_clock::now();
    bell->Wait(nanoseconds(0), seconds(30));
    EXPECT_LT(steady_clock::now() - start, seconds(5)) << "iteration " << i;
    honest.join();
  }
  stop.store(true);
  vandal.join();
}

// Rank 1 keeps its "sleeping" flag at 0; rank 0 sleeps on done_gen and must
// still be woken when the daemon publishes (with one shared counter, as in
// control block version 2, zeroing it cost every other rank its wake-ups).
TEST(ControlIsolationTest, RogueSleeperFlagCannotCostOthersTheirWakeups) {
  Job job;
  ControlMapping rank0 = job.Rank(0);
  ControlMapping rank1 = job.Rank(1);
  RankHeader* rogue = job.layout.rank_header(rank1.data(), 1);
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    while (!stop.load()) rogue->sleeping.store(0);
  });
  void* d = job.map.data();
  for (uint64_t i = 1; i <= 20; ++i) {
    std::thread daemon([&] {
      std::this_thread::sleep_for(milliseconds(2));
      job.layout.done_seq(d)[0].store(i, std::memory_order_release);
      WakeClients(job.layout, d);
    });
    auto start = steady_clock::now();
    const auto* done = &job.layout.done_seq(rank0.data())[0];
    EXPECT_TRUE(WaitForDaemon(
        job.layout.header(rank0.data()),
        job.layout.rank_header(rank0.data(), 0),
        [&] { return done->load(std::memory_order_acquire) >= i; },
        nanoseconds(0), seconds(30)));
    EXPECT_LT(steady_clock::now() - start, seconds(5)) << "iteration " << i;
    daemon.join();
  }
  stop.store(true);
  vandal.join();
}

}  // namespace
}  // namespace gradd
