// StallInspector: turns "a bucket has waited too long" into a named
// culprit. The job's engine thread tells it, every few tens of
// milliseconds, which buckets are waiting and since when (Update); a bucket
// that has waited longer than stall_warning_ms is logged (warn), reported
// to the job's event sink (gradd_stalls_total) once per bucket and
// iteration, and listed by Current() (the admin API) while it waits; one
// that has waited longer than stall_shutdown_ms makes Update return the
// message the engine fails the job with, so a hang ends in an error naming
// who is missing at every waiting trainer.
//
// Who is missing, as far as the daemon can know:
//   - waiting for local ranks: the ranks whose ready_seq has not reached
//     the iteration (the control block), and the bucket's parameters (the
//     daemon sees a bucket's readiness, not each parameter's);
//   - in the inter-node allreduce (multi-node): the other nodes of the job;
//     which of them has not sent, the collective does not say. The stalled
//     node itself reports its missing local ranks.
//
// Threads: Update on the engine thread; Current from any thread (a short
// lock).
#ifndef GRADD_SERVER_ENGINE_OBSERVE_STALL_INSPECTOR_H_
#define GRADD_SERVER_ENGINE_OBSERVE_STALL_INSPECTOR_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/observe/job_events.h"

namespace gradd {

// A bucket that is waiting: for local ranks to hand it over, or, handed to
// the reducer, for the inter-node allreduce.
struct BucketWait {
  uint64_t iteration = 0;
  int bucket = 0;
  int64_t since_ns = 0;  // engine clock
  bool in_network = false;
  std::vector<int> missing_local_ranks;  // when !in_network
};

class StallInspector {
 public:
  struct Options {
    std::string job_id;
    // 0: off.
    std::chrono::milliseconds warning{0};
    std::chrono::milliseconds shutdown{0};
    // The job's other nodes (multi-node), as named in reports.
    std::vector<std::string> other_nodes;
  };

  explicit StallInspector(Options options);

  bool enabled() const { return threshold_ns_ > 0; }
  // Buckets that have waited less than this are not worth passing to
  // Update (the smaller of the two thresholds that are on).
  int64_t threshold_ns() const { return threshold_ns_; }

  // Engine thread. `waits`: the buckets waiting now; `param_names(bucket)`
  // the names of a bucket's parameters; `sink` (may be null) gets each new
  // stall. Returns the message to fail the job with when a bucket has
  // waited past the shutdown threshold.
  std::optional<std::string> Update(
      int64_t now_ns, std::vector<BucketWait> waits,
      absl::FunctionRef<std::vector<std::string>(int)> param_names,
      JobEventSinkInterface* sink);

  // The buckets stalled now (waited past the warning threshold, or past
  // the shutdown one when no warning is set). Any thread.
  std::vector<StallReport> Current() const;

 private:
  StallReport Report(int64_t now_ns, BucketWait wait,
                     std::vector<std::string> params) const;

  const Options options_;
  const int64_t threshold_ns_;
  // (iteration, bucket) already reported, so each is counted once.
  std::vector<std::pair<uint64_t, int>> reported_;
  mutable absl::Mutex mu_;
  std::vector<StallReport> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_OBSERVE_STALL_INSPECTOR_H_
