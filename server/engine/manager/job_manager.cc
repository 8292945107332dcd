#include "server/engine/manager/job_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "server/logging.h"

namespace gradd {
namespace {

// Wraps an Attach's answer so every outcome is logged once, with its reason.
NodeHandlerInterface::AttachCallback LoggedAttach(
    const v1::AttachRequest& request,
    NodeHandlerInterface::AttachCallback done) {
  return [job = request.job_id(), rank = request.local_rank(),
          session = request.session_id(), done = std::move(done)](
             absl::StatusOr<v1::AttachResponse> answer) mutable {
    if (answer.ok()) {
      spdlog::info("job '{}': local rank {} (session {}) attached", job, rank,
                   session);
    } else {
      spdlog::warn("job '{}': attach of local rank {} (session {}) failed: {}",
                   job, rank, session, answer.status().ToString());
    }
    std::move(done)(std::move(answer));
  };
}

}  // namespace

JobManager::JobManager(const v1::DaemonConfig& config,
                       SessionRegistryInterface* sessions, ThreadPool* pool,
                       ReducerFactory reducer_factory,
                       std::shared_ptr<CoordinatorSelector> coordinators,
                       EngineEventSinkInterface* events,
                       DeviceAllocatorInterface* devices)
    : config_(config),
      sessions_(sessions),
      pool_(pool),
      reducer_factory_(std::move(reducer_factory)),
      coordinators_(std::move(coordinators)),
      events_(events),
      no_devices_(devices == nullptr
                      ? std::make_unique<NoDeviceAllocator>(
                            "the daemon was started without GPU support")
                      : nullptr),
      devices_(devices != nullptr ? devices : no_devices_.get()) {
  if (coordinators_ == nullptr) {
    // No listen_address here: serving from start-up is the Daemon's
    // business; on-demand serving and the configured address work alike.
    CoordinatorSelector::Options options;
    options.coordinator_address = config.rendezvous().coordinator_address();
    options.port = static_cast<int>(config.rendezvous().port());
    coordinators_ = *CoordinatorSelector::Create(std::move(options));
  }
  if (reducer_factory_ == nullptr) {
    reducer_factory_ = [this](const JobSpec& spec)
        -> absl::StatusOr<std::unique_ptr<BucketReducerInterface>> {
      return std::make_unique<FusedReducer>(pool_, spec.local_world_size);
    };
  }
  {
    absl::MutexLock lock(&mailbox_->mu);
    mailbox_->owner = this;
  }
  thread_ = std::thread([this] { Loop(); });
}

JobManager::~JobManager() { Stop(); }

void JobManager::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;  // dropped tasks' callbacks are destroyed unanswered
  tasks_.push_back(std::move(task));
}

template <typename Callback, typename Work>
void JobManager::PostOrAnswer(Callback done, absl::Status if_stopping,
                              Work work) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      tasks_.push_back(
          [work = std::move(work), done = std::move(done)]() mutable {
            std::move(work)(std::move(done));
          });
      return;
    }
  }
  std::move(done)(std::move(if_stopping));
}

void JobManager::HandleAttach(v1::AttachRequest request, absl::Time deadline,
                              AttachCallback done) {
  done = LoggedAttach(request, std::move(done));
  if (events_ != nullptr) {
    done = [events = events_, done = std::move(done)](
               absl::StatusOr<v1::AttachResponse> answer) mutable {
      events->OnAttach(answer.status().code());
      std::move(done)(std::move(answer));
    };
  }
  PostOrAnswer(std::move(done),
               absl::UnavailableError("gradd daemon is stopping"),
               [this, request = std::move(request),
                deadline](AttachCallback done) mutable {
                 DoAttach(std::move(request), deadline, std::move(done));
               });
}

void JobManager::HandleAttachCancelled(uint64_t session_id) {
  Post([this, session_id] { DoAttachCancelled(session_id); });
}

void JobManager::HandleDetach(v1::DetachRequest request, DetachCallback done) {
  done = [job = request.job_id(), rank = request.local_rank(),
          done = std::move(done)](absl::Status status) mutable {
    if (status.ok()) {
      spdlog::info("job '{}': local rank {} detached", job, rank);
    } else {
      spdlog::warn("job '{}': detach of local rank {} refused: {}", job, rank,
                   status.ToString());
    }
    std::move(done)(std::move(status));
  };
  PostOrAnswer(std::move(done), absl::OkStatus(),
               [this, request = std::move(request)](DetachCallback done) {
                 DoDetach(request, std::move(done));
               });
}

void JobManager::HandleSetCommHook(v1::CommHookSetRequest request,
                                   SetCommHookCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      tasks_.push_back([this, request = std::move(request),
                        done = std::move(done)]() mutable {
        DoSetCommHook(request, std::move(done));
      });
      return;
    }
  }
  std::move(done)(absl::UnavailableError("gradd daemon is stopping"));
}

void JobManager::DoSetCommHook(const v1::CommHookSetRequest& request,
                               SetCommHookCallback done) {
  const std::string who = absl::StrCat("local rank ", request.local_rank(),
                                       " of job '", request.job_id(), "'");
  auto job = jobs_.find(request.job_id());
  if (!bindings_.Holds(request.session_id(), request.job_id(),
                       request.local_rank()) ||
      job == jobs_.end()) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        who, " is not attached through session ", request.session_id(),
        "; attach before choosing a communication hook")));
    return;
  }
  std::move(done)(
      job->second.job->SetCommHook(request.local_rank(), request.hook()));
}

void JobManager::OnSessionClosed(uint64_t session_id) {
  Post([this, session_id] { DoSessionClosed(session_id); });
}

void JobManager::Shutdown(absl::string_view message) {
  absl::Notification done;
  Post([this, &done, msg = std::string(message)] {
    shutting_down_ = true;
    shutdown_message_ = msg;
    std::vector<std::string> ids;
    for (const auto& [id, p] : pending_) ids.push_back(id);
    for (const std::string& id : ids) {
      FailPending(
          id, absl::UnavailableError(absl::StrCat("job '", id, "': ", msg)));
    }
    for (auto& [id, active] : jobs_) {
      active.job->Fail(absl::StatusCode::kUnavailable,
                       absl::StrCat("job '", id, "': ", msg));
    }
    done.Notify();
  });
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return;
  }
  done.WaitForNotification();
}

void JobManager::Stop() {
  {
    // Formation threads still running drop their results from now on.
    absl::MutexLock lock(&mailbox_->mu);
    mailbox_->owner = nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // Control thread gone: its state is ours now.
  for (auto& [id, p] : pending_) {
    for (PendingRank& r : p.TakeAll()) {
      std::move(r.done)(absl::UnavailableError("gradd daemon stopped"));
    }
  }
  pending_.clear();
  jobs_.clear();  // ~Job joins each engine and unmaps its memory
  bindings_.Clear();
}

void JobManager::SetWatchdog(absl::AnyInvocable<void()> ping,
                             absl::Duration interval) {
  Post([this, ping = std::move(ping), interval]() mutable {
    watchdog_.Set(std::move(ping), interval);
  });
}

int JobManager::NumJobs() {
  absl::Notification done;
  int n = 0;
  Post([&] {
    n = static_cast<int>(pending_.size() + jobs_.size());
    done.Notify();
  });
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return static_cast<int>(pending_.size() + jobs_.size());
  }
  done.WaitForNotification();
  return n;
}

absl::Time JobManager::NextDeadline() const {
  absl::Time next = jobs_.empty() ? absl::InfiniteFuture() : next_heartbeat_;
  next = std::min(next, watchdog_.next());
  for (const auto& [id, active] : jobs_) {
    next = std::min(next, active.restarts.NextDeadline());
  }
  // A forming job's ranks are answered by its formation.
  for (const auto& [id, p] : pending_) next = std::min(next, p.NextDeadline());
  return next;
}

void JobManager::Loop() {
  while (true) {
    std::deque<Task> batch;
    const absl::Time next = NextDeadline();
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !tasks_.empty();
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), next);
      if (stop_) return;
      batch.swap(tasks_);
    }
    for (Task& t : batch) std::move(t)();
    ExpireAttaches(absl::Now());
    ExpireRestarts(absl::Now());
    Beat(absl::Now());
    watchdog_.Tick(absl::Now());
  }
}

void JobManager::Beat(absl::Time now) {
  if (now < next_heartbeat_) return;
  for (auto& [id, active] : jobs_) active.job->Heartbeat();
  next_heartbeat_ = now + absl::Milliseconds(config_.heartbeat_interval_ms());
}

void JobManager::RankGone(const std::string& job_id, int rank, bool detached) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  ActiveJob& active = it->second;
  bindings_.UnbindRank(job_id, rank);
  const bool was_restarting = active.job->restarting(rank);
  active.restarts.Clear(rank);
  active.job->RankGone(rank, detached);
  active.rebuild->RankGone(rank);
  // A restarting rank's detach was counted when its session closed.
  if (events_ != nullptr && !was_restarting) events_->OnDetach(detached);
  if (active.job->live_ranks() == 0 && active.job->restarting_ranks() == 0) {
    const ReducerStats st = active.job->reducer_stats();
    auto ms = [](uint64_t ns) { return absl::StrFormat("%.3f", ns / 1e6); };
    // A job that only ran collectives (no model buckets) says so.
    const uint64_t rounds = active.job->collective_rounds();
    spdlog::info(
        "{}",
        st.buckets == 0 && rounds > 0
            ? absl::StrCat("job '", job_id, "' ended: ", rounds,
                           " collective round(s), no gradient buckets")
            : absl::StrCat(
                  "job '", job_id, "' ended: ", st.buckets, " buckets reduced",
                  rounds > 0
                      ? absl::StrCat(", ", rounds, " collective round(s)")
                      : std::string(),
                  "; phase split ms: local_reduce=", ms(st.local_reduce_ns),
                  " network=", ms(st.network_ns),
                  " write_back=", ms(st.write_back_ns)));
    // A process that still maps the block (its rank was detached from
    // under it, or it outlived its session) reads this instead of waiting
    // for an engine that is gone.
    active.job->Fail(absl::StatusCode::kAborted,
                     absl::StrCat("job '", job_id,
                                  "' ended: every local rank detached or "
                                  "disconnected"));
    jobs_.erase(it);  // joins the engine, releases the memory
  }
}

void JobManager::HandleRebuildBuckets(v1::RebuildBucketsRequest request,
                                      absl::Time deadline,
                                      RebuildCallback done) {
  PostOrAnswer(std::move(done),
               absl::UnavailableError("gradd daemon is stopping"),
               [this, request = std::move(request),
                deadline](RebuildCallback done) mutable {
                 DoRebuild(std::move(request), deadline, std::move(done));
               });
}

void JobManager::DoRebuild(v1::RebuildBucketsRequest request,
                           absl::Time deadline, RebuildCallback done) {
  if (absl::Status bound = bindings_.CheckHolds(
          request.session_id(), request.job_id(), request.local_rank());
      !bound.ok()) {
    std::move(done)(std::move(bound));
    return;
  }
  auto job = jobs_.find(request.job_id());
  if (job == jobs_.end()) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "local rank ", request.local_rank(), " of job '", request.job_id(),
        "' asked to rebuild buckets before the job formed")));
    return;
  }
  job->second.rebuild->Add(std::move(request), deadline, std::move(done));
}

void JobManager::DoDetach(const v1::DetachRequest& request,
                          DetachCallback done) {
  if (absl::Status bound = bindings_.CheckHolds(
          request.session_id(), request.job_id(), request.local_rank());
      !bound.ok()) {
    std::move(done)(std::move(bound));
    return;
  }
  const std::string who = absl::StrCat("local rank ", request.local_rank(),
                                       " of job '", request.job_id(), "'");
  const std::string job_id = request.job_id();
  const int rank = request.local_rank();
  if (pending_.contains(job_id)) {
    WithdrawPendingRank(job_id, rank,
                        absl::CancelledError(absl::StrCat(
                            who, " detached before the job formed")),
                        absl::StrCat(who, " detached"), /*unclaim=*/false);
  } else {
    RankGone(job_id, rank, /*detached=*/true);
  }
  std::move(done)(absl::OkStatus());
}

void JobManager::DoSessionClosed(uint64_t session_id) {
  const SessionBindings::Rank* bound = bindings_.Find(session_id);
  if (bound == nullptr) return;  // never attached, or detached already
  const std::string job_id = bound->job_id;
  const int rank = bound->local_rank;
  if (pending_.contains(job_id)) {
    const std::string who =
        absl::StrCat("local rank ", rank, " of job '", job_id, "'");
    if (!WithdrawPendingRank(job_id, rank,
                             absl::UnavailableError(absl::StrCat(
                                 who, " closed its session while attaching")),
                             absl::StrCat(who, " closed its session"),
                             /*unclaim=*/false)) {
      bindings_.Unbind(session_id);
    }
    return;
  }
  if (auto job = jobs_.find(job_id);
      job != jobs_.end() && job->second.restarts.has_grace() &&
      !shutting_down_ && !job->second.rebuild->in_progress() &&
      job->second.job->RankRestarting(rank, "session closed without Detach")) {
    ActiveJob& active = job->second;
    bindings_.Unbind(session_id);
    active.restarts.Away(rank, absl::Now());
    if (events_ != nullptr) events_->OnDetach(/*clean=*/false);
    spdlog::warn(
        "job '{}': local rank {} is restarting (session closed without "
        "Detach); the job waits up to rank_restart_grace_ms={} for it to "
        "attach again",
        job_id, rank, active.restarts.grace_ms());
    return;
  }
  spdlog::warn("job '{}': local rank {} closed its session without detaching",
               job_id, rank);
  RankGone(job_id, rank, /*detached=*/false);
}

}  // namespace gradd
