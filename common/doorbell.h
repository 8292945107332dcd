// Cross-process wake-ups over a job's control state
// (common/control_block.h): a short spin, then a sleep. Clients sleep on a
// shared futex in the (read-only) job block; the daemon sleeps in poll() on
// one bell pipe per rank, so no word a rank can write decides whether the
// daemon wakes for another rank.
#ifndef GRADD_COMMON_DOORBELL_H_
#define GRADD_COMMON_DOORBELL_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/control_block.h"
#include "common/shm.h"

namespace gradd {

// futex(FUTEX_WAIT) on a word in shared memory: returns when *word != expected,
// on a wake, on a signal or after `timeout` (whichever first; spurious
// returns are allowed, callers re-check their condition). Needs only read
// access to the word.
void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::nanoseconds timeout);
void FutexWakeAll(const std::atomic<uint32_t>* word);

// Client side: tell the daemon something was published. `me` is this rank's
// RankHeader, `bell_fd` the write end of its bell.
void RingDaemon(const ControlHeader* header, RankHeader* me, int bell_fd);
// Daemon side: wake every client sleeping on done_gen (`base` maps every
// rank block).
void WakeClients(const ControlLayout& layout, void* base);

// Client side: waits until `ready()` is true, the job failed (status != 0)
// or `timeout` passed; spins for `spin` first, then sleeps on done_gen with
// me->sleeping raised. Returns true if ready() became true.
template <typename Pred>
bool WaitForDaemon(const ControlHeader* header, RankHeader* me, Pred ready,
                   std::chrono::nanoseconds spin,
                   std::chrono::nanoseconds timeout);

// One bell per rank: a pipe whose read end the daemon keeps and whose write
// end goes to the rank. A pipe rather than an eventfd because the two ends
// are separate open files: the rank cannot drain the daemon's end nor change
// its O_NONBLOCK flag.
struct BellPipe {
  UniqueFd read_end;
  UniqueFd write_end;
};
absl::StatusOr<BellPipe> CreateBell();

// The CPUs this process may run on (its affinity mask); 0 if unknown.
int UsableCpus();

// The engine's spin on a crowded node. Each local rank spins in its own
// waits (WaitForDaemon, and whatever the trainer does between buckets), so
// with `ranks` >= `cpus` the engine's spin runs on a core that a rank needs.
// sched_yield() does not give it back: the scheduler (EEVDF) hands the core
// only to a thread it finds eligible, and a rank that just ran often is not,
// so a spinning engine can hold the core while the rank it waits for sits
// runnable; and a core kept busy by the spin is not idle when a rank wakes.
// (perf sched traces: bench/README.md, "The small-bucket wait path".)
// Crowded, the engine spins at most this long, enough for the next ring of
// a tight loop of small buckets, then sleeps in poll().
inline constexpr std::chrono::microseconds kCrowdedSpin{10};

// The spin the engine uses: `configured`, capped at kCrowdedSpin when the
// node is crowded (`cpus` <= `ranks`); `cpus` 0 (unknown) counts as roomy.
std::chrono::nanoseconds EngineSpin(std::chrono::nanoseconds configured,
                                    size_t ranks, int cpus);

// Daemon side: the engine's wait for any rank's (or a daemon thread's) ring.
// Snapshot() before scanning, Wait() after a scan found nothing to do.
// Ring() is for daemon threads (stop, a rank gone, a join round, a rebuild)
// and may be called from any thread; the rest from the engine thread only.
class DaemonDoorbell {
 public:
  // `base` maps the job block and every rank block read-write; bell_fds are
  // the read ends of the ranks' bells (not owned). `cpus`: the cores the
  // engine and the ranks share (EngineSpin); 0 asks UsableCpus().
  static absl::StatusOr<std::unique_ptr<DaemonDoorbell>> Create(
      const ControlLayout& layout, void* base, std::vector<int> bell_fds,
      int cpus = 0);

  void Ring();
  void Snapshot();
  // Returns once something rang since Snapshot() or `timeout` passed; spins
  // for EngineSpin(`spin`, ...) first.
  void Wait(std::chrono::nanoseconds spin, std::chrono::nanoseconds timeout);

 private:
  DaemonDoorbell(ControlHeader* header, std::vector<RankHeader*> ranks,
                 std::vector<int> bell_fds, UniqueFd wake_fd, int cpus);
  bool Moved() const;
  void SleepInPoll(std::chrono::nanoseconds timeout);

  ControlHeader* const header_;
  const std::vector<RankHeader*> ranks_;
  const int cpus_;
  // poll set: the ranks' bells, then wake_fd_; a bell whose write end was
  // closed (POLLHUP for good) is set to -1, which poll() skips.
  std::vector<int> poll_fds_;
  UniqueFd wake_fd_;  // eventfd, daemon-only
  std::atomic<uint32_t> internal_{0};
  // Per rank, not a sum: a rank moving its word backwards must not cancel
  // another rank's ring.
  std::vector<uint32_t> seen_;
  uint32_t seen_internal_ = 0;
};

}  // namespace gradd

#include "common/doorbell_inl.h"

#endif  // GRADD_COMMON_DOORBELL_H_
