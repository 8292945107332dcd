#include "common/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

namespace gradd {
namespace {

// The futex words live in a MAP_SHARED memfd mapped by several processes, so
// the futexes must be shared ones (no FUTEX_PRIVATE_FLAG): the kernel then
// keys them by (inode, offset) instead of (mm, address).
long Futex(std::atomic<uint32_t>* word, int op, uint32_t val,
           const struct timespec* timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, val, timeout,
                 nullptr, 0);
}

}  // namespace

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  struct timespec ts;
  // Cap a relative wait at one day; callers loop and re-check anyway, and
  // a larger value only risks overflowing tv_sec on odd platforms.
  constexpr std::chrono::nanoseconds kMaxWait = std::chrono::hours(24);
  std::chrono::nanoseconds t = std::min(timeout, kMaxWait);
  ts.tv_sec = static_cast<time_t>(t.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(t.count() % 1'000'000'000);
  // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "re-check".
  Futex(word, FUTEX_WAIT, expected, &ts);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  Futex(word, FUTEX_WAKE, INT_MAX, nullptr);
}

void RingDaemon(ControlHeader* header) {
  // seq_cst on both sides (here: bump, then read the flag; daemon: raise the
  // flag, then read the bell) is the Dekker pattern: at least one side sees
  // the other's write, so either the daemon notices the bell or we wake it.
  header->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (header->daemon_sleeping.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&header->doorbell);
  }
}

void WakeClients(ControlHeader* header) {
  header->done_gen.fetch_add(1, std::memory_order_seq_cst);
  if (header->sleepers.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&header->done_gen);
  }
}

uint32_t WaitDoorbell(ControlHeader* header, uint32_t seen,
                      std::chrono::nanoseconds spin,
                      std::chrono::nanoseconds timeout) {
  using doorbell_internal::Clock;
  uint32_t v = header->doorbell.load(std::memory_order_acquire);
  if (v != seen) return v;

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      doorbell_internal::SaturatingDeadline(start, timeout);
  const Clock::time_point spin_until =
      std::min(deadline, doorbell_internal::SaturatingDeadline(start, spin));
  if (doorbell_internal::Spin(spin_until, [&] {
        v = header->doorbell.load(std::memory_order_acquire);
        return v != seen;
      })) {
    return v;
  }

  while (true) {
    Clock::time_point now = Clock::now();
    if (now >= deadline) {
      return header->doorbell.load(std::memory_order_acquire);
    }
    // A counter rather than a flag: should two daemon threads ever wait on
    // one block, one leaving must not hide the other from the clients.
    header->daemon_sleeping.fetch_add(1, std::memory_order_seq_cst);
    v = header->doorbell.load(std::memory_order_seq_cst);
    if (v == seen) {
      FutexWait(&header->doorbell, seen,
                doorbell_internal::SleepBudget(deadline, now));
      v = header->doorbell.load(std::memory_order_acquire);
    }
    header->daemon_sleeping.fetch_sub(1, std::memory_order_seq_cst);
    if (v != seen) return v;
  }
}

}  // namespace gradd
