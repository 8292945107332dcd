// Choosing a job's communication hook: validating a CommHookSpec
// (proto/gradd/v1/comm_hook.proto), agreeing on one across a job's local
// ranks, and building the hook object.
//
// Life of a job's choice (CommHookSelection, one per job):
//
//   open --Set(rank, spec) per rank (Node.SetCommHook)--> open
//     |  (attach-time spec / daemon default for ranks that set none)
//     +--Resolve() on the engine thread, when the job's first bucket is
//        about to start--> resolved (Set: FAILED_PRECONDITION from now on)
//
// Threads: Set from the JobManager's control thread, Resolve from the job's
// engine thread; internally locked.
#ifndef GRADD_SERVER_HOOKS_COMM_HOOK_FACTORY_H_
#define GRADD_SERVER_HOOKS_COMM_HOOK_FACTORY_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/bucket_planner.h"
#include "common/thread_pool.h"
#include "gradd/v1/comm_hook.pb.h"
#include "server/hooks/comm_hook.h"

namespace gradd {

// The names Node.SetCommHook and the daemon config accept.
const std::vector<std::string>& SupportedCommHooks();

// OK, or INVALID_ARGUMENT naming the problem (`who`: "local rank 1 of job
// 'x'", "default_comm_hook") and, for an unknown name, the supported ones.
absl::Status ValidateCommHookSpec(const v1::CommHookSpec& spec,
                                  absl::string_view who);
// `spec` with torch's defaults filled in (name "" -> "allreduce", PowerSGD
// fields), so two specs that mean the same hook compare equal.
v1::CommHookSpec NormalizeCommHookSpec(const v1::CommHookSpec& spec);
// One line for logs and error messages, e.g. "powerSGD(rank 2, start 10,
// min_compression_rate 2, error_feedback, warm_start, eps 0, seed 0)".
std::string DescribeCommHook(const v1::CommHookSpec& spec);

struct CommHookContext {
  int world_size = 1;
  const std::vector<ParamInfo>* params = nullptr;
  const BucketPlan* plan = nullptr;
  ThreadPool* pool = nullptr;  // may be null
};

// The hook object for a validated, normalised spec; null for "allreduce"
// (the reducers' own path is the average).
absl::StatusOr<std::unique_ptr<CommHookInterface>> MakeCommHook(
    const v1::CommHookSpec& spec, const CommHookContext& context);

class CommHookSelection {
 public:
  // `job_default`: the attach-time choice (already validated).
  CommHookSelection(std::string job_id, int local_world_size,
                    v1::CommHookSpec job_default);

  // Local rank `rank` chooses `spec`. FAILED_PRECONDITION when resolved or
  // when the rank chose already; INVALID_ARGUMENT for an invalid spec or
  // one that differs from another rank's choice (both ranks named).
  absl::Status Set(int rank, const v1::CommHookSpec& spec);
  // Closes the choice: the normalised spec every rank agreed on, or
  // INVALID_ARGUMENT naming two ranks that disagree (one chose, the other
  // kept the job's attach-time hook).
  absl::StatusOr<v1::CommHookSpec> Resolve();

 private:
  const std::string job_id_;
  const v1::CommHookSpec default_;
  absl::Mutex mu_;
  std::vector<std::optional<v1::CommHookSpec>> chosen_ ABSL_GUARDED_BY(mu_);
  bool resolved_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_HOOKS_COMM_HOOK_FACTORY_H_
