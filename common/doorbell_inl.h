// Template part of common/doorbell.h; include that header, not this one.
#ifndef GRADD_COMMON_DOORBELL_INL_H_
#define GRADD_COMMON_DOORBELL_INL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace gradd {
namespace doorbell_internal {

// Tells the core we are spinning (frees pipeline resources for the sibling
// hyperthread and avoids the memory-order mis-speculation flush on exit).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

using Clock = std::chrono::steady_clock;

// now + d without overflowing when callers pass "forever"
// (nanoseconds::max()).
inline Clock::time_point SaturatingDeadline(Clock::time_point now,
                                            std::chrono::nanoseconds d) {
  if (d <= std::chrono::nanoseconds::zero()) return now;
  if (d >= Clock::time_point::max() - now) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(d);
}

// Spin iterations between clock reads and yields: a steady_clock read costs
// ~20 ns, a pause ~40-140 cycles, so the clock is a small fraction, while
// the yield lets a trainer or the daemon run when cores are oversubscribed.
inline constexpr int kSpinsPerCheck = 64;

// 1 + the CPU the calling thread runs on (sched_getcpu, a vDSO read), 0 if
// unknown: the form of ControlHeader::stand_down_cpu and RankHeader::cpu.
uint32_t CpuHint();

// The spin phase of every wait: calls done() (true: stop) with a pause
// between calls, reads the clock and yields every kSpinsPerCheck calls.
// True as soon as done() is; false once spin_until has passed or, checked
// with the clock, once stand_down() says the thread we wait for needs this
// core (spinning on would only delay it).
template <typename Done, typename StandDown>
bool Spin(Clock::time_point spin_until, Done done, StandDown stand_down) {
  while (true) {
    for (int i = 0; i < kSpinsPerCheck; ++i) {
      if (done()) return true;
      CpuRelax();
    }
    if (Clock::now() >= spin_until || stand_down()) return false;
    std::this_thread::yield();
  }
}

// Whether the daemon asks the waiters on this thread's CPU to stand down.
inline bool AskedToStandDown(const ControlHeader* header) {
  const uint32_t cpu = header->stand_down_cpu.load(std::memory_order_relaxed);
  return cpu != 0 && cpu == CpuHint();
}

// How long a futex sleep may last from `now` to reach `deadline`
// (time_point::max(): forever).
inline std::chrono::nanoseconds SleepBudget(Clock::time_point deadline,
                                            Clock::time_point now) {
  if (deadline == Clock::time_point::max()) {
    return std::chrono::nanoseconds::max();
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
}

}  // namespace doorbell_internal

template <typename Pred>
bool WaitForDaemon(const ControlHeader* header, RankHeader* me, Pred ready,
                   std::chrono::nanoseconds spin,
                   std::chrono::nanoseconds timeout) {
  using doorbell_internal::Clock;
  auto failed = [header] {
    return header->status.load(std::memory_order_acquire) != 0;
  };
  if (ready()) return true;
  if (failed()) return false;

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      doorbell_internal::SaturatingDeadline(start, timeout);
  const Clock::time_point spin_until =
      std::min(deadline, doorbell_internal::SaturatingDeadline(start, spin));

  // Phase 1: spin. Small buckets finish within microseconds; a futex sleep
  // and wake would cost more than the reduction itself.
  bool result = false;
  if (doorbell_internal::Spin(
          spin_until,
          [&] {
            if (ready()) {
              result = true;
              return true;
            }
            return failed();  // Stop with result false.
          },
          [header] { return doorbell_internal::AskedToStandDown(header); })) {
    return result;
  }

  // Phase 2: sleep on done_gen. The generation is read *before* the
  // condition: the daemon publishes done/error first and bumps done_gen
  // after, so if the condition is still false, a later publish changes
  // done_gen away from `gen` and the futex returns at once. Our own
  // `sleeping` flag is raised before the final check (seq_cst against the
  // daemon's seq_cst done_gen bump and flag loads) so the daemon cannot skip
  // the wake. Only this rank's flag: another rank clearing its own can only
  // cost itself wake-ups.
  while (true) {
    uint32_t gen = header->done_gen.load(std::memory_order_seq_cst);
    if (ready()) return true;
    if (failed()) return false;
    Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    me->sleeping.fetch_add(1, std::memory_order_seq_cst);
    if (header->done_gen.load(std::memory_order_seq_cst) == gen) {
      FutexWait(&header->done_gen, gen,
                doorbell_internal::SleepBudget(deadline, now));
    }
    me->sleeping.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace gradd

#endif  // GRADD_COMMON_DOORBELL_INL_H_
