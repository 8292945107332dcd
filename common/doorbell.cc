#include "common/doorbell.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradd {
namespace {

// The futex words live in a MAP_SHARED memfd mapped by several processes, so
// the futexes must be shared ones (no FUTEX_PRIVATE_FLAG): the kernel then
// keys them by (inode, offset) instead of (mm, address).
long Futex(const std::atomic<uint32_t>* word, int op, uint32_t val,
           const struct timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  // The kernel only reads the word for FUTEX_WAIT / FUTEX_WAKE, so a
  // read-only mapping (the job block in a trainer) is fine.
  return syscall(SYS_futex,
                 const_cast<uint32_t*>(reinterpret_cast<const uint32_t*>(word)),
                 op, val, timeout, nullptr, 0);
}

struct timespec ToTimespec(std::chrono::nanoseconds timeout) {
  // Cap a relative wait at one day; callers loop and re-check anyway, and
  // a larger value only risks overflowing tv_sec on odd platforms.
  constexpr std::chrono::nanoseconds kMaxWait = std::chrono::hours(24);
  std::chrono::nanoseconds t = std::min(timeout, kMaxWait);
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(t.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(t.count() % 1'000'000'000);
  return ts;
}

}  // namespace

void FutexWait(const std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  struct timespec ts = ToTimespec(timeout);
  // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "re-check".
  Futex(word, FUTEX_WAIT, expected, &ts);
}

void FutexWakeAll(const std::atomic<uint32_t>* word) {
  Futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

namespace doorbell_internal {

uint32_t CpuHint() {
  const int cpu = sched_getcpu();
  return cpu < 0 ? 0 : static_cast<uint32_t>(cpu) + 1;
}

}  // namespace doorbell_internal

void RingDaemon(const ControlHeader* header, RankHeader* me, int bell_fd) {
  // Where this rank runs, for the engine's stand_down_cpu; written only
  // when it changed, so the line the daemon polls moves no more often.
  const uint32_t cpu = doorbell_internal::CpuHint();
  if (me->cpu.load(std::memory_order_relaxed) != cpu) {
    me->cpu.store(cpu, std::memory_order_relaxed);
  }
  // seq_cst on both sides (here: bump, then read the flag; daemon: raise the
  // flag, then read every rank's word) is the Dekker pattern: at least one
  // side sees the other's write, so either the daemon notices the bump or we
  // write the bell. The pipe holds the byte until the daemon polls, so the
  // wake cannot be lost.
  me->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (header->daemon_sleeping.load(std::memory_order_seq_cst) != 0) {
    const char byte = 1;
    // EAGAIN: the pipe is full, so the daemon is woken anyway.
    ssize_t n = ::write(bell_fd, &byte, 1);
    (void)n;
  }
}

void WakeClients(const ControlLayout& layout, void* base) {
  ControlHeader* header = layout.header(base);
  header->done_gen.fetch_add(1, std::memory_order_seq_cst);
  // Any rank's flag: a rank that clears its own flag can only miss its own
  // wake-up.
  for (uint32_t r = 0; r < layout.local_world_size(); ++r) {
    if (layout.rank_header(base, r)->sleeping.load(std::memory_order_seq_cst) !=
        0) {
      FutexWakeAll(&header->done_gen);
      return;
    }
  }
}

absl::StatusOr<BellPipe> CreateBell() {
  int fds[2];
  // Non-blocking on both ends: the daemon drains without blocking, a rank's
  // write never blocks (a full pipe already wakes the daemon).
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pipe2 for a rank's bell failed: ", std::strerror(errno)));
  }
  BellPipe bell;
  bell.read_end.reset(fds[0]);
  bell.write_end.reset(fds[1]);
  return bell;
}

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

std::chrono::nanoseconds EngineSpin(std::chrono::nanoseconds configured,
                                    size_t ranks, int cpus) {
  if (cpus <= 0 || static_cast<size_t>(cpus) > ranks) return configured;
  return std::min<std::chrono::nanoseconds>(configured, kCrowdedSpin);
}

absl::StatusOr<std::unique_ptr<DaemonDoorbell>> DaemonDoorbell::Create(
    const ControlLayout& layout, void* base, std::vector<int> bell_fds,
    int cpus) {
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("eventfd failed: ", std::strerror(errno)));
  }
  std::vector<RankHeader*> ranks;
  for (uint32_t r = 0; r < layout.local_world_size(); ++r) {
    ranks.push_back(layout.rank_header(base, r));
  }
  return std::unique_ptr<DaemonDoorbell>(new DaemonDoorbell(
      layout.header(base), std::move(ranks), std::move(bell_fds),
      std::move(wake), cpus > 0 ? cpus : UsableCpus()));
}

DaemonDoorbell::DaemonDoorbell(ControlHeader* header,
                               std::vector<RankHeader*> ranks,
                               std::vector<int> bell_fds, UniqueFd wake_fd,
                               int cpus)
    : header_(header),
      ranks_(std::move(ranks)),
      cpus_(cpus),
      poll_fds_(std::move(bell_fds)),
      wake_fd_(std::move(wake_fd)),
      seen_(ranks_.size(), 0) {
  poll_fds_.push_back(wake_fd_.get());
}

void DaemonDoorbell::Ring() {
  internal_.fetch_add(1, std::memory_order_seq_cst);
  const uint64_t one = 1;
  // Always: daemon threads ring rarely (stop, a rank gone, a join round).
  ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  (void)n;
}

void DaemonDoorbell::Snapshot() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    seen_[r] = ranks_[r]->doorbell.load(std::memory_order_acquire);
  }
  seen_internal_ = internal_.load(std::memory_order_acquire);
}

bool DaemonDoorbell::Moved() const {
  if (internal_.load(std::memory_order_seq_cst) != seen_internal_) {
    return true;
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r]->doorbell.load(std::memory_order_seq_cst) != seen_[r]) {
      return true;
    }
  }
  return false;
}

void DaemonDoorbell::Wait(std::chrono::nanoseconds spin,
                          std::chrono::nanoseconds timeout) {
  using doorbell_internal::Clock;
  if (Moved()) return;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      doorbell_internal::SaturatingDeadline(start, timeout);
  const Clock::time_point spin_until =
      std::min(deadline, doorbell_internal::SaturatingDeadline(
                             start, EngineSpin(spin, ranks_.size(), cpus_)));
  // Stand down like the ranks do: a rank the engine waits for sits on
  // this CPU, and spinning would keep it from publishing.
  if (doorbell_internal::Spin(
          spin_until, [&] { return Moved(); },
          [&] { return doorbell_internal::AskedToStandDown(header_); })) {
    return;
  }

  while (true) {
    Clock::time_point now = Clock::now();
    if (now >= deadline) return;
    // A counter rather than a flag: should two daemon threads ever wait on
    // one block, one leaving must not hide the other from the clients.
    header_->daemon_sleeping.fetch_add(1, std::memory_order_seq_cst);
    bool moved = Moved();
    if (!moved) {
      SleepInPoll(doorbell_internal::SleepBudget(deadline, now));
      moved = Moved();
    }
    header_->daemon_sleeping.fetch_sub(1, std::memory_order_seq_cst);
    if (moved) return;
  }
}

void DaemonDoorbell::SleepInPoll(std::chrono::nanoseconds timeout) {
  std::vector<pollfd> pfds(poll_fds_.size());
  for (size_t i = 0; i < pfds.size(); ++i) {
    pfds[i].fd = poll_fds_[i];
    pfds[i].events = POLLIN;
    pfds[i].revents = 0;
  }
  struct timespec ts = ToTimespec(timeout);
  int n = ppoll(pfds.data(), pfds.size(), &ts, nullptr);
  if (n <= 0) return;  // timeout or EINTR: the caller re-checks
  char drain[256];
  for (size_t i = 0; i < pfds.size(); ++i) {
    const short ev = pfds[i].revents;
    if (ev == 0) continue;
    if (ev & POLLIN) {
      // Our own read end, non-blocking: nobody else can read it or make it
      // blocking.
      while (::read(pfds[i].fd, drain, sizeof(drain)) > 0) {
      }
    }
    if ((ev & (POLLHUP | POLLERR | POLLNVAL)) && !(ev & POLLIN) &&
        i + 1 < pfds.size()) {
      // The rank closed its write end (it exited or misbehaves): the pipe
      // would report POLLHUP forever and turn this sleep into a busy loop.
      // The rank's death reaches the job through its session socket.
      poll_fds_[i] = -1;
    }
  }
}

}  // namespace gradd
