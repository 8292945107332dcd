// Cross-process wake-ups over a control block (common/control_block.h):
// a short spin, then a shared (non-private) futex on the mapped word.
// Thread-safe; no state of its own.
#ifndef GRADD_COMMON_DOORBELL_H_
#define GRADD_COMMON_DOORBELL_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/control_block.h"

namespace gradd {

// futex(FUTEX_WAIT) on a word in shared memory: returns when *word != expected,
// on a wake, on a signal or after `timeout` (whichever first; spurious
// returns are allowed, callers re-check their condition).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::nanoseconds timeout);
void FutexWakeAll(std::atomic<uint32_t>* word);

// Client side: tell the daemon something was published.
void RingDaemon(ControlHeader* header);
// Daemon side: wake every client sleeping on done_gen.
void WakeClients(ControlHeader* header);

// Daemon side: returns once the doorbell moved past `seen` or `timeout`
// passed; spins for `spin` first. Returns the doorbell's new value.
uint32_t WaitDoorbell(ControlHeader* header, uint32_t seen,
                      std::chrono::nanoseconds spin,
                      std::chrono::nanoseconds timeout);

// Client side: waits until `ready()` is true, the job failed (status != 0)
// or `timeout` passed; spins for `spin` first, then sleeps on done_gen.
// Returns true if ready() became true.
template <typename Pred>
bool WaitForDaemon(ControlHeader* header, Pred ready,
                   std::chrono::nanoseconds spin,
                   std::chrono::nanoseconds timeout);

}  // namespace gradd

#include "common/doorbell_inl.h"

#endif  // GRADD_COMMON_DOORBELL_H_
