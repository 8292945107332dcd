// JobManager's admin view: snapshots and the liveness ping, each a bounded
// hop to the control thread (job_manager.h). Nothing here holds a lock
// while the caller waits, and the control thread never waits on a caller.
#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/manager/attach_validation.h"
#include "server/engine/manager/job_manager.h"

namespace gradd {
namespace {

constexpr absl::Duration kStopSlice = absl::Milliseconds(100);

}  // namespace

template <typename T>
absl::StatusOr<T> JobManager::AskControlThread(absl::AnyInvocable<T() &&> fn,
                                               absl::Time deadline) {
  // Shared with the task: it may run after the caller gave up.
  struct Answer {
    absl::Mutex mu;
    std::optional<T> value ABSL_GUARDED_BY(mu);
  };
  auto answer = std::make_shared<Answer>();
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("gradd daemon is stopping");
    tasks_.push_back([answer, fn = std::move(fn)]() mutable {
      T value = std::move(fn)();
      absl::MutexLock lock(&answer->mu);
      answer->value = std::move(value);
    });
  }
  // Waits in slices so that a manager stopped meanwhile (whose control
  // thread will never run the task) is seen within one slice: a daemon
  // shutting down is not held up by an admin call until its deadline.
  while (true) {
    {
      absl::MutexLock lock(&answer->mu);
      auto has = [&answer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answer->mu) {
        return answer->value.has_value();
      };
      if (answer->mu.AwaitWithDeadline(
              absl::Condition(&has),
              std::min(deadline, absl::Now() + kStopSlice))) {
        return std::move(*answer->value);
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          "the job manager's control loop did not answer in time (is the "
          "daemon hung?)");
    }
    absl::MutexLock lock(&mu_);
    if (stop_) return absl::UnavailableError("gradd daemon is stopping");
  }
}

JobSnapshot JobManager::SnapshotOf(const std::string& id,
                                   const PendingJob& pending,
                                   bool detail) const {
  JobSnapshot s;
  s.job_id = id;
  s.state = pending.forming() ? JobSnapshot::State::kForming
                              : JobSnapshot::State::kPending;
  s.local_world_size = pending.world();
  const PendingRank* first = nullptr;
  for (int r = 0; r < pending.world(); ++r) {
    const std::optional<PendingRank>& slot = pending.rank(r);
    if (!slot) continue;
    if (first == nullptr) first = &*slot;
    RankSnapshot rank;
    rank.local_rank = r;
    rank.state = RankSnapshot::State::kAttaching;
    rank.session_id = slot->request.session_id();
    s.ranks.push_back(rank);
  }
  if (first != nullptr) {
    s.num_nodes = NumNodes(first->request);
    s.initial_num_nodes = s.num_nodes;
    s.min_nodes = EffectiveMinNodes(first->request, config_);
    s.node_rank =
        first->request.has_node_rank() ? first->request.node_rank() : 0;
    s.has_used_map = FindUsedMapParam(first->params) >= 0;
    if (detail) s.params = first->params;
  }
  return s;
}

JobSnapshot JobManager::SnapshotOf(const ActiveJob& active, bool detail) const {
  JobSnapshot s = active.job->Snapshot(detail);
  const std::string& id = active.job->spec().job_id;
  for (RankSnapshot& rank : s.ranks) {
    rank.session_id = bindings_.SessionOf(id, rank.local_rank);
    if (rank.state == RankSnapshot::State::kRestarting &&
        active.restarts.away(rank.local_rank)) {
      rank.restart_deadline_unix_ns =
          absl::ToUnixNanos(active.restarts.deadline(rank.local_rank));
    }
  }
  // node_ids are the live ones (Job::Snapshot), not the spec's first.
  if (active.rebuild != nullptr) {
    RebuildCoordinator::Record record = active.rebuild->record();
    s.rebuilt = record.rebuilt;
    s.rebuild_iteration = record.iteration;
    if (detail) s.rebuild_ready_order = std::move(record.ready_order);
  }
  return s;
}

absl::StatusOr<std::vector<JobSnapshot>> JobManager::Snapshot(
    absl::Time deadline, bool detail, const std::string* job_id) {
  std::optional<std::string> only;
  if (job_id != nullptr) only = *job_id;
  using Result = absl::StatusOr<std::vector<JobSnapshot>>;
  absl::StatusOr<Result> answer = AskControlThread<Result>(
      [this, detail, only]() -> Result {
        std::vector<JobSnapshot> out;
        if (only.has_value()) {
          if (auto it = jobs_.find(*only); it != jobs_.end()) {
            out.push_back(SnapshotOf(it->second, detail));
          } else if (auto p = pending_.find(*only); p != pending_.end()) {
            out.push_back(SnapshotOf(p->first, p->second, detail));
          } else {
            return absl::NotFoundError(
                absl::StrCat("no job '", *only, "' on this daemon"));
          }
          return out;
        }
        for (const auto& [id, p] : pending_) {
          out.push_back(SnapshotOf(id, p, detail));
        }
        for (const auto& [id, active] : jobs_) {
          out.push_back(SnapshotOf(active, detail));
        }
        return out;
      },
      deadline);
  if (!answer.ok()) return answer.status();
  return *std::move(answer);
}

absl::Status JobManager::Ping(absl::Time deadline) {
  absl::StatusOr<bool> serving =
      AskControlThread<bool>([this] { return !shutting_down_; }, deadline);
  if (!serving.ok()) return serving.status();
  if (!*serving) return absl::UnavailableError("gradd daemon is shutting down");
  return absl::OkStatus();
}

// A job's own data, read on the control thread like Snapshot (same bound,
// same errors), NOT_FOUND naming the job when there is none.
template <typename T>
absl::StatusOr<T> JobManager::QueryJob(const std::string& job_id,
                                       absl::AnyInvocable<T(const Job*)> fn) {
  absl::StatusOr<absl::StatusOr<T>> answer =
      AskControlThread<absl::StatusOr<T>>(
          [this, job_id, fn = std::move(fn)]() mutable -> absl::StatusOr<T> {
            if (auto it = jobs_.find(job_id); it != jobs_.end()) {
              return fn(it->second.job.get());
            }
            if (pending_.contains(job_id)) return fn(nullptr);
            return absl::NotFoundError(
                absl::StrCat("no job '", job_id, "' on this daemon"));
          },
          absl::Now() + absl::Seconds(10));
  if (!answer.ok()) return answer.status();
  return *std::move(answer);
}

absl::StatusOr<std::vector<TimelineEvent>> JobManager::Timeline(
    const std::string& job_id) {
  return QueryJob<std::vector<TimelineEvent>>(job_id, [](const Job* job) {
    return job != nullptr ? job->timeline() : std::vector<TimelineEvent>();
  });
}

absl::StatusOr<std::vector<StallReport>> JobManager::Stalls(
    const std::string& job_id) {
  return QueryJob<std::vector<StallReport>>(job_id, [](const Job* job) {
    return job != nullptr ? job->stalls() : std::vector<StallReport>();
  });
}

}  // namespace gradd
