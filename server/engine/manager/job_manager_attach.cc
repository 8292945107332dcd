// JobManager's pending attaches (job_manager.h): a rank's Attach checked and
// bound to its session, the ranks that wait for the others (expired at
// their deadline), and, once every local rank of the job is there, their
// agreement (attach_validation.h), the plan, the memory check and the job's
// spec, handed on to the single-node activation or the multi-node
// formation (job_manager_formation.cc). Control thread only.
#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/manager/attach_validation.h"
#include "server/engine/manager/device_attach.h"
#include "server/engine/manager/job_manager.h"
#include "server/engine/manager/job_memory.h"
#include "server/logging.h"

namespace gradd {

void JobManager::DoAttach(v1::AttachRequest request, absl::Time deadline,
                          AttachCallback done) {
  if (shutting_down_) {
    std::move(done)(absl::UnavailableError(shutdown_message_));
    return;
  }
  absl::StatusOr<std::vector<ParamInfo>> params =
      ValidateAttachRequest(request, config_);
  if (!params.ok()) {
    std::move(done)(params.status());
    return;
  }
  const std::string& id = request.job_id();
  const int rank = request.local_rank();
  const std::string who =
      absl::StrCat("local rank ", rank, " of job '", id, "'");
  const uint64_t sid = request.session_id();
  if (absl::Status free = bindings_.CheckFree(sid); !free.ok()) {
    std::move(done)(std::move(free));
    return;
  }
  if (!sessions_->Claim(sid)) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        who, ": session ", sid,
        " is not connected; connect to the daemon's session socket first and "
        "pass the session id it sends")));
    return;
  }
  // From here on every refusal gives the session back (Unclaim), so a
  // refused session is closed as idle unless the trainer retries on it.
  absl::StatusOr<int> device =
      ResolveRankDevice(request, *params, *devices_, who);
  if (!device.ok()) {
    sessions_->Unclaim(sid);
    std::move(done)(device.status());
    return;
  }
  if (auto it = jobs_.find(id); it != jobs_.end()) {
    // A restarted process can be quicker than the news of its old
    // session's end (OnSessionClosed, posted behind this Attach): act on
    // it now, so the rank is restarting and this Attach takes it back.
    // That may end the job (the rank was its last and cannot restart).
    if (const uint64_t held = bindings_.SessionOf(id, rank);
        it->second.restarts.has_grace() && held != 0 &&
        !sessions_->IsLive(held)) {
      DoSessionClosed(held);
    }
  }
  if (auto it = jobs_.find(id); it != jobs_.end()) {
    ActiveJob& active = it->second;
    if (rank < active.job->local_world_size() && active.job->restarting(rank)) {
      DoRestartAttach(active, std::move(request), *std::move(params), *device,
                      std::move(done));
      return;
    }
    sessions_->Unclaim(sid);
    if (bindings_.SessionOf(id, rank) != 0) {
      std::move(done)(
          absl::AlreadyExistsError(absl::StrCat(who, " is already attached")));
    } else {
      std::move(done)(absl::FailedPreconditionError(absl::StrCat(
          "job '", id, "' is running and cannot take new ranks; ", who,
          " can attach again once every rank of the job has detached")));
    }
    return;
  }
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    if (pending_.size() + jobs_.size() >= config_.max_jobs()) {
      sessions_->Unclaim(sid);
      std::move(done)(absl::ResourceExhaustedError(
          absl::StrCat(who, ": the daemon already serves its maximum of ",
                       config_.max_jobs(), " jobs")));
      return;
    }
    it = pending_.emplace(id, PendingJob(request.local_world_size())).first;
  }
  PendingJob& p = it->second;
  if (p.world() != request.local_world_size()) {
    sessions_->Unclaim(sid);
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat(who, " says local world size ", request.local_world_size(),
                     " but ranks already attached said ", p.world())));
    return;
  }
  if (p.rank(rank)) {
    sessions_->Unclaim(sid);
    std::move(done)(absl::AlreadyExistsError(
        absl::StrCat(who, " is already attached (session ",
                     p.rank(rank)->request.session_id(), ")")));
    return;
  }
  const absl::Time limit = std::min(
      deadline, absl::Now() + absl::Milliseconds(config_.attach_timeout_ms()));
  if (absl::Status bound = bindings_.Bind(sid, id, rank); !bound.ok()) {
    sessions_->Unclaim(sid);
    std::move(done)(std::move(bound));
    return;
  }
  if (p.Add(rank, PendingRank{std::move(request), *std::move(params), limit,
                              std::move(done), *device})) {
    FormJob(id);
  }
}

void JobManager::ExpireAttaches(absl::Time now) {
  std::vector<std::string> emptied;
  for (auto& [id, p] : pending_) {
    // A forming job is bounded by its formation (TakeExpired: none).
    const std::vector<int> missing = p.Missing();
    for (auto& [r, attach] : p.TakeExpired(now)) {
      std::move(attach.done)(absl::DeadlineExceededError(absl::StrCat(
          "job '", id, "': local rank ", r,
          " timed out waiting for the other local ranks to attach; missing "
          "local rank",
          missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
          " of local world size ", p.world())));
      Unbind(attach.request.session_id());
    }
    if (p.empty()) emptied.push_back(id);
  }
  for (const std::string& id : emptied) pending_.erase(id);
}

void JobManager::Unbind(uint64_t session_id) {
  bindings_.Unbind(session_id);
  sessions_->Unclaim(session_id);
}

void JobManager::DoAttachCancelled(uint64_t session_id) {
  const SessionBindings::Rank* bound = bindings_.Find(session_id);
  if (bound == nullptr) return;  // answered (and unbound) already
  const std::string job_id = bound->job_id;
  const int rank = bound->local_rank;
  auto p = pending_.find(job_id);
  if (p == pending_.end()) return;  // formed: the attach was answered
  const std::optional<PendingRank>& slot = p->second.rank(rank);
  if (!slot || slot->request.session_id() != session_id) return;
  // Nobody reads the answer (the call is over); it is logged.
  const std::string who =
      absl::StrCat("local rank ", rank, " of job '", job_id, "'");
  WithdrawPendingRank(job_id, rank,
                      absl::CancelledError(
                          absl::StrCat("local rank ", rank, " of job '", job_id,
                                       "': the client gave up on its Attach")),
                      absl::StrCat(who, " gave up on its Attach"),
                      /*unclaim=*/true);
}

bool JobManager::WithdrawPendingRank(const std::string& job_id, int rank,
                                     absl::Status answer,
                                     absl::string_view what, bool unclaim) {
  auto p = pending_.find(job_id);
  if (p == pending_.end()) return false;
  std::optional<PendingRank> attach = p->second.Take(rank);
  if (!attach) return false;
  const uint64_t session_id = attach->request.session_id();
  if (unclaim) {
    Unbind(session_id);
  } else {
    bindings_.Unbind(session_id);
  }
  std::move(attach->done)(std::move(answer));
  if (p->second.forming()) {
    FailPending(job_id,
                absl::AbortedError(absl::StrCat(
                    what, " while the job was forming with the other nodes")));
  } else if (p->second.empty()) {
    pending_.erase(p);
  }
  return true;
}

void JobManager::FailPending(const std::string& job_id,
                             const absl::Status& status) {
  auto it = pending_.find(job_id);
  if (it == pending_.end()) return;
  spdlog::error("job '{}' failed to form: {}", job_id, status.ToString());
  PendingJob p = std::move(it->second);
  pending_.erase(it);
  for (PendingRank& r : p.TakeAll()) {
    Unbind(r.request.session_id());
    std::move(r.done)(status);
  }
}

void JobManager::FormJob(const std::string& job_id) {
  PendingJob& p = pending_.at(job_id);
  const PendingRank& first = *p.rank(0);
  for (int r = 1; r < p.world(); ++r) {
    const PendingRank& other = *p.rank(r);
    if (absl::Status same =
            CompareLocalAttach(job_id, r, first.request, first.params,
                               other.request, other.params, config_);
        !same.ok()) {
      FailPending(job_id, same);
      return;
    }
  }

  const PlannerOptions options = PlannerOptionsFor(first.request, config_);
  // A collective-only job has no buckets (the planner refuses no params).
  absl::StatusOr<BucketPlan> plan =
      first.params.empty() ? absl::StatusOr<BucketPlan>(BucketPlan{})
                           : PlanBuckets(first.params, options);
  if (!plan.ok()) {
    FailPending(job_id, absl::Status(plan.status().code(),
                                     absl::StrCat("job '", job_id, "': ",
                                                  plan.status().message())));
    return;
  }
  // Shared and device memory together (job_memory.h).
  std::vector<int> rank_devices;
  for (const auto& r : p.ranks()) rank_devices.push_back(r->device);
  if (absl::Status s = CheckJobMemory(
          job_id,
          JobMemoryNeedOf(first.params, *plan, first.request.broadcast_bytes(),
                          rank_devices, NumNodes(first.request)),
          config_.max_job_memory_bytes());
      !s.ok()) {
    FailPending(job_id, s);
    return;
  }

  for (int r = 1; r < p.world(); ++r) {
    if (absl::Status same =
            CompareNodeSetup(job_id, r, first.request, p.rank(r)->request);
        !same.ok()) {
      FailPending(job_id, same);
      return;
    }
  }

  JobSpec spec;
  spec.job_id = job_id;
  spec.local_world_size = p.world();
  spec.params = first.params;
  spec.plan = *std::move(plan);
  spec.planner = options;
  spec.broadcast_bytes = first.request.broadcast_bytes();
  spec.spin = std::chrono::microseconds(config_.spin_us());
  spec.comm_hook = first.request.comm_hook().name().empty()
                       ? config_.default_comm_hook()
                       : first.request.comm_hook();
  spec.hook_pool = pool_;
  spec.timeline_events = config_.timeline_events();
  spec.stall_warning = std::chrono::milliseconds(config_.stall_warning_ms());
  spec.stall_shutdown = std::chrono::milliseconds(config_.stall_shutdown_ms());
  spec.devices = devices_;
  spec.collective_timeout =
      std::chrono::milliseconds(config_.rendezvous().collective_timeout_ms());
  spec.rank_devices = std::move(rank_devices);
  spec.rank_restart_grace = std::chrono::milliseconds(
      EffectiveRankRestartGrace(first.request, config_));
  // Autotune's switches are rebuilds, which jobs that survive a rank
  // restart or a node loss do not make (their ranks would disagree).
  spec.autotune = AutotunesBucketCap(first.request, config_) &&
                  spec.rank_restart_grace.count() == 0 &&
                  (NumNodes(first.request) <= 1 ||
                   EffectiveMinNodes(first.request, config_) == 0);
  if (spec.autotune) {
    spec.autotune_options =
        AutotuneOptionsOf(config_, NumNodes(first.request) > 1);
  }
  if (NumNodes(first.request) > 1) {
    // Node loss and arrival (job.h "Elastic multi-node jobs"); the elastic
    // prefix follows from the formation round (FinishNodeFormation).
    spec.min_nodes = EffectiveMinNodes(first.request, config_);
    spec.divide_by_initial_world_size =
        first.request.divide_by_initial_world_size();
    StartNodeFormation(job_id, std::move(spec));
    return;
  }
  absl::StatusOr<std::unique_ptr<BucketReducerInterface>> reducer =
      reducer_factory_(spec);
  Activate(job_id, std::move(spec), std::move(reducer));
}

}  // namespace gradd
