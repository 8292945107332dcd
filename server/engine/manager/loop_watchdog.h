// A liveness ping from inside an event loop: the loop calls Tick() after
// each round and wakes by next() at the latest, so the ping stops when the
// loop hangs (a task that never returns) -- which is what a service
// manager's watchdog (systemd WATCHDOG=1) should see.
//
// Not thread-safe: owned and called by the loop's thread only.
#ifndef GRADD_SERVER_ENGINE_MANAGER_LOOP_WATCHDOG_H_
#define GRADD_SERVER_ENGINE_MANAGER_LOOP_WATCHDOG_H_

#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

namespace gradd {

class LoopWatchdog {
 public:
  using Ping = absl::AnyInvocable<void()>;

  // Pings at once on the next Tick, then every `interval`. A null `ping` or
  // an infinite interval turns the watchdog off.
  void Set(Ping ping, absl::Duration interval) {
    ping_ = std::move(ping);
    interval_ = interval;
    next_ = absl::InfinitePast();
  }

  // When the loop must wake for the next ping (InfiniteFuture when off).
  absl::Time next() const { return active() ? next_ : absl::InfiniteFuture(); }

  void Tick(absl::Time now) {
    if (!active() || now < next_) return;
    ping_();
    next_ = now + interval_;
  }

 private:
  bool active() const {
    return ping_ != nullptr && interval_ != absl::InfiniteDuration();
  }

  Ping ping_;
  absl::Duration interval_ = absl::InfiniteDuration();
  absl::Time next_ = absl::InfinitePast();
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_LOOP_WATCHDOG_H_
