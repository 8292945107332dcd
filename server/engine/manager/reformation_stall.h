// ReformationStall: when an elastic job's re-formations go nowhere. A
// group that breaks again and again before any iteration completes (the
// same fault each time) must fail the job, naming the last cause, instead
// of re-forming forever. Every node sees the same verdicts (their
// max_completed), so every node counts alike; nodes arriving one by one
// each let an iteration complete in between, which starts the count again.
//
// Pure logic, owned by the JobManager's control thread.
#ifndef GRADD_SERVER_ENGINE_MANAGER_REFORMATION_STALL_H_
#define GRADD_SERVER_ENGINE_MANAGER_REFORMATION_STALL_H_

#include <cstdint>

namespace gradd {

class ReformationStall {
 public:
  // Re-formations in a row without an iteration completed in between
  // after which the job fails.
  static constexpr int kMaxInARow = 8;

  // One more re-formation, whose verdict says the largest completed
  // iteration of its nodes is `max_completed`. Returns true when the job
  // should fail: kMaxInARow re-formations in a row saw the same value.
  bool Observe(uint64_t max_completed) {
    if (seen_ && max_completed == last_) {
      ++in_a_row_;
    } else {
      in_a_row_ = 1;
    }
    seen_ = true;
    last_ = max_completed;
    return in_a_row_ >= kMaxInARow;
  }
  // Re-formations in a row at the last value (1 after the first).
  int in_a_row() const { return in_a_row_; }

 private:
  bool seen_ = false;
  uint64_t last_ = 0;
  int in_a_row_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_REFORMATION_STALL_H_
