// The engine's rules for rank restart (job.h's rank lifecycle;
// common/control_block.h "Rank restart", "Re-formation"): whether the job
// can wait for a rank whose session closed, which gradient iteration a
// rank's return (or a re-formation) aborts, and the runs of consecutive
// aborts a rank may still be behind.
//
// Pure logic, owned by the engine thread (CanWait is a pure function the
// job manager's thread calls too): no threads, no I/O. The ranks' states
// and the restarted ranks waiting are rank_states.h's; Job keeps the
// control block, reads the done sequences and asks here.
#ifndef GRADD_SERVER_ENGINE_JOB_RANK_RESTARTS_H_
#define GRADD_SERVER_ENGINE_JOB_RANK_RESTARTS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"

namespace gradd {

class RankRestarts {
 public:
  // What the job is doing when a rank's session closes without Detach.
  struct Situation {
    bool has_grace = false;            // rank_restart_grace > 0
    bool plan_switch_in_play = false;  // rebuild expected or switching
    bool failed = false;               // the job has failed
    bool join_open = false;            // a rank opened a join epoch
  };
  // The job waits for the rank (it is restarting) only with a grace, no
  // plan switch in play (it needs every rank at its boundary), not failed
  // (a failed job waits for nobody) and no join (uneven inputs) open (its
  // rounds count the ranks).
  static bool CanWait(const Situation& s);

  // The gradient iteration an abort covers (step 1 of "Rank restart"),
  // from the plan's `num_buckets` done sequences (done(b)): the one in
  // progress (some bucket done for it and some not), or else the next.
  struct IterationAbort {
    uint64_t iteration = 0;  // 0: the plan has no buckets
    uint64_t last = 0;       // the ranks go on at last + 1
  };
  static IterationAbort PlanIterationAbort(
      size_t num_buckets, absl::FunctionRef<uint64_t(size_t)> done);

  // What one abort did (control_block.h "Rank restart", steps 1-2, for a
  // rank's return or a re-formation): the iteration and collective round
  // aborted and where the ranks go on.
  struct Aborted {
    uint64_t iteration = 0;  // 0: the plan has no buckets
    uint64_t round = 0;
    uint64_t last = 0;            // the ranks' next iteration is last + 1
    uint64_t collective_seq = 0;  // bcast_done_seq after the abort
  };

  // Records that `iteration` (collective `round`) was aborted, the
  // previous abort being `previous` (0: none): a run of consecutive aborts
  // (re-formations one after the other while a rank ran its state sync)
  // starts anew unless it follows the previous one.
  void NoteIterationAbort(uint64_t previous, uint64_t iteration);
  void NoteRoundAbort(uint64_t previous, uint64_t round);
  uint64_t iteration_run_start() const { return iteration_run_start_; }
  uint64_t round_run_start() const { return round_run_start_; }

  // A live rank's row (read as s) lags the daemon's `done` only because the
  // daemon aborted that iteration / round (`aborted`) before the rank
  // published it, or a run of consecutive ones starting at `run_start`:
  // "not ready yet", not a protocol error.
  static bool BehindAbort(uint64_t s, uint64_t done, uint64_t aborted,
                          uint64_t run_start) {
    return aborted != 0 && done == aborted && s < done &&
           s + 1 >= std::min(run_start == 0 ? done : run_start, done);
  }
  bool BehindIterationAbort(uint64_t s, uint64_t done, uint64_t aborted) const {
    return BehindAbort(s, done, aborted, iteration_run_start_);
  }
  bool BehindRoundAbort(uint64_t s, uint64_t done, uint64_t aborted) const {
    return BehindAbort(s, done, aborted, round_run_start_);
  }

 private:
  // The first of the latest run of consecutive aborted iterations / rounds.
  uint64_t iteration_run_start_ = 0;
  uint64_t round_run_start_ = 0;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_RANK_RESTARTS_H_
