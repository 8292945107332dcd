#include "server/engine/job/rank_restarts.h"

#include <algorithm>
#include <limits>

namespace gradd {

bool RankRestarts::CanWait(const Situation& s) {
  return s.has_grace && !s.plan_switch_in_play && !s.failed && !s.join_open;
}

RankRestarts::IterationAbort RankRestarts::PlanIterationAbort(
    size_t num_buckets, absl::FunctionRef<uint64_t(size_t)> done) {
  // Aborting the next iteration when none is in progress gives every rank
  // the same agreement point: a survivor that checked for a state sync
  // before the abort and went on into iteration i finds it aborted and
  // syncs before retrying, exactly like one that checks after it.
  IterationAbort a;
  if (num_buckets == 0) return a;
  uint64_t lo = std::numeric_limits<uint64_t>::max();
  uint64_t hi = 0;
  for (size_t b = 0; b < num_buckets; ++b) {
    const uint64_t d = done(b);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  a.iteration = hi > lo ? hi : lo + 1;
  a.last = std::max(hi, a.iteration);
  return a;
}

void RankRestarts::NoteIterationAbort(uint64_t previous, uint64_t iteration) {
  if (previous == 0 || iteration != previous + 1) {
    iteration_run_start_ = iteration;
  }
}

void RankRestarts::NoteRoundAbort(uint64_t previous, uint64_t round) {
  if (previous == 0 || round != previous + 1) round_run_start_ = round;
}

}  // namespace gradd
