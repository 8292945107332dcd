// What every hand-off from other threads to a job's engine thread shares
// (reformation_inbox.h, rank_states.h, plan_switch_requests.h): the fast
// flag the engine reads on each turn of its loop ("something is there",
// one atomic load, no lock) and the wake-up that rings the engine after a
// post. Each mailbox keeps its own lock and sets the flag under it, as
// what it holds changes.
#ifndef GRADD_SERVER_ENGINE_JOB_MAILBOX_H_
#define GRADD_SERVER_ENGINE_JOB_MAILBOX_H_

#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace gradd {

class Mailbox {
 public:
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Any thread: something was posted and not taken yet.
  bool pending() const { return pending_.load(std::memory_order_acquire); }

 protected:
  // `wake` rings the engine.
  explicit Mailbox(absl::AnyInvocable<void()> wake) : wake_(std::move(wake)) {}
  ~Mailbox() = default;

  void set_pending(bool pending) {
    pending_.store(pending, std::memory_order_release);
  }
  // The flag, cleared: whether there is anything to take.
  bool TakePending() {
    return pending_.exchange(false, std::memory_order_acq_rel);
  }
  // After a post, outside the mailbox's lock.
  void Wake() { wake_(); }
  // What `slot` (guarded by `mu`) holds, leaving it empty, and the flag
  // cleared: the engine's take of a mailbox with one slot.
  template <typename T>
  T TakeSlot(absl::Mutex* mu, T* slot) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    T taken;
    absl::MutexLock lock(mu);
    taken.swap(*slot);
    set_pending(false);
    return taken;
  }

 private:
  absl::AnyInvocable<void()> wake_;
  std::atomic<bool> pending_{false};
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_MAILBOX_H_
