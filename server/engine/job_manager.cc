#include "server/engine/job_manager.h"

#include <cmath>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace gradd {
namespace {

constexpr size_t kMaxJobIdBytes = 256;
constexpr size_t kMaxParamNameBytes = 4096;
constexpr int kMaxDims = 32;
constexpr double kMiB = 1 << 20;

bool JobIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') ||
         absl::string_view("._:@/+=-").find(c) != absl::string_view::npos;
}

std::string DescribeParam(const ParamInfo& p) {
  return absl::StrCat("'", p.name, "' [", absl::StrJoin(p.shape, ", "), "] ",
                      std::string(DTypeName(p.dtype)));
}

bool SameParam(const ParamInfo& a, const ParamInfo& b) {
  return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype;
}

// First difference between two ranks' models, or OK.
absl::Status CompareModels(const std::string& job_id, int ra,
                           const std::vector<ParamInfo>& a, int rb,
                           const std::vector<ParamInfo>& b) {
  const size_t n = std::min(a.size(), b.size());
  std::string head = absl::StrCat("local ranks ", ra, " and ", rb, " of job '",
                                  job_id, "' registered different models: ");
  for (size_t i = 0; i < n; ++i) {
    if (SameParam(a[i], b[i])) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        head, "parameter ", i, " is ", DescribeParam(a[i]), " on local rank ",
        ra, " but ", DescribeParam(b[i]), " on local rank ", rb));
  }
  if (a.size() != b.size()) {
    const bool a_longer = a.size() > b.size();
    const ParamInfo& extra = a_longer ? a[n] : b[n];
    return absl::InvalidArgumentError(absl::StrCat(
        head, "local rank ", ra, " registered ", a.size(),
        " parameters and local rank ", rb, " registered ", b.size(),
        "; parameter ", n, " is ", DescribeParam(extra), " on local rank ",
        a_longer ? ra : rb, " and missing on local rank ", a_longer ? rb : ra));
  }
  return absl::OkStatus();
}

double CapOr(double requested, double fallback) {
  return requested > 0 ? requested : fallback;
}

}  // namespace

absl::StatusOr<std::vector<ParamInfo>> ValidateAttachRequest(
    const v1::AttachRequest& req, const v1::DaemonConfig& config) {
  const std::string& id = req.job_id();
  if (id.empty()) {
    return absl::InvalidArgumentError("job id is empty");
  }
  if (id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id is ", id.size(), " bytes; the limit is ", kMaxJobIdBytes));
  }
  for (char c : id) {
    if (!JobIdChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job id '", absl::CEscape(id), "' contains '", absl::CEscape({&c, 1}),
          "'; allowed are letters, digits and ._:@/+=-"));
    }
  }
  const std::string job = absl::StrCat("job '", id, "'");
  if (req.local_world_size() < 1 ||
      static_cast<uint32_t>(req.local_world_size()) >
          config.max_local_world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(job, ": local world size ", req.local_world_size(),
                     " is outside 1..", config.max_local_world_size()));
  }
  if (req.local_rank() < 0 || req.local_rank() >= req.local_world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        job, ": local rank ", req.local_rank(),
        " is out of range for local world size ", req.local_world_size(),
        " (valid: 0..", req.local_world_size() - 1, ")"));
  }
  const std::string who =
      absl::StrCat("local rank ", req.local_rank(), " of ", job);
  if (req.num_nodes() > 1) {
    return absl::UnimplementedError(
        absl::StrCat(who, " asks for ", req.num_nodes(),
                     " nodes; this daemon supports single-node jobs only"));
  }
  for (auto [name, cap] :
       {std::pair<const char*, double>{"bucket_cap_mb", req.bucket_cap_mb()},
        {"first_bucket_cap_mb", req.first_bucket_cap_mb()}}) {
    if (!std::isfinite(cap) || cap < 0 || cap > kMiB) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": ", name, " = ", cap, " must be in [0, 1048576] (0 = the ",
          "daemon's default)"));
    }
  }
  if (req.broadcast_bytes() > config.max_job_memory_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": broadcast_bytes ", req.broadcast_bytes(),
                     " exceeds the daemon's per-job memory limit of ",
                     config.max_job_memory_bytes()));
  }
  if (req.params().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " registered no parameters"));
  }
  if (static_cast<uint32_t>(req.params_size()) > config.max_params()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, " registered ", req.params_size(),
                     " parameters; the limit is ", config.max_params()));
  }
  std::vector<ParamInfo> params;
  params.reserve(req.params_size());
  uint64_t total_bytes = 0;
  for (int i = 0; i < req.params_size(); ++i) {
    const v1::ParamSpec& p = req.params(i);
    if (p.name().empty() || p.name().size() > kMaxParamNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": parameter ", i, " has ",
          p.name().empty() ? "an empty name" : "a name over 4096 bytes"));
    }
    absl::StatusOr<DType> dtype = DTypeFromInt(p.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": unsupported dtype ", v1::DType_Name(p.dtype()), " (",
          static_cast<int>(p.dtype()), ") for parameter '", p.name(),
          "' (index ", i, "); supported: float32, float64, float16, bfloat16"));
    }
    if (p.shape_size() > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": parameter '", p.name(), "' has ", p.shape_size(),
                       " dimensions; the limit is ", kMaxDims));
    }
    uint64_t numel = 1;
    for (int64_t d : p.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": parameter '", p.name(), "' has a negative dimension (",
            absl::StrJoin(p.shape(), ", "), ")"));
      }
      if (d != 0 && numel > config.max_job_memory_bytes() / d) {
        numel = std::numeric_limits<uint64_t>::max();
        break;
      }
      numel *= d;
    }
    const size_t elem = DTypeSize(*dtype);
    if (numel > config.max_job_memory_bytes() / elem ||
        total_bytes + numel * elem > config.max_job_memory_bytes()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(who, ": parameters up to '", p.name(),
                       "' exceed the daemon's per-job memory limit of ",
                       config.max_job_memory_bytes(), " bytes"));
    }
    total_bytes += numel * elem;
    params.push_back(
        ParamInfo{p.name(), {p.shape().begin(), p.shape().end()}, *dtype});
  }
  return params;
}

JobManager::JobManager(const v1::DaemonConfig& config,
                       SessionRegistryInterface* sessions, ThreadPool* pool,
                       ReducerFactory reducer_factory)
    : config_(config),
      sessions_(sessions),
      pool_(pool),
      reducer_factory_(std::move(reducer_factory)) {
  if (reducer_factory_ == nullptr) {
    reducer_factory_ = [this](const JobSpec& spec)
        -> absl::StatusOr<std::unique_ptr<BucketReducerInterface>> {
      return std::make_unique<FusedReducer>(pool_, spec.local_world_size);
    };
  }
  thread_ = std::thread([this] { Loop(); });
}

JobManager::~JobManager() { Stop(); }

void JobManager::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (stop_) return;  // dropped tasks' callbacks are destroyed unanswered
  tasks_.push_back(std::move(task));
}

void JobManager::HandleAttach(v1::AttachRequest request, absl::Time deadline,
                              AttachCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      tasks_.push_back([this, request = std::move(request), deadline,
                        done = std::move(done)]() mutable {
        DoAttach(std::move(request), deadline, std::move(done));
      });
      return;
    }
  }
  std::move(done)(absl::UnavailableError("gradd daemon is stopping"));
}

void JobManager::HandleDetach(v1::DetachRequest request, DetachCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_) {
      tasks_.push_back([this, request = std::move(request),
                        done = std::move(done)]() mutable {
        DoDetach(request, std::move(done));
      });
      return;
    }
  }
  std::move(done)(absl::OkStatus());
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
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // Control thread gone: its state is ours now.
  for (auto& [id, p] : pending_) {
    for (auto& r : p.ranks) {
      if (r) std::move(r->done)(absl::UnavailableError("gradd daemon stopped"));
    }
  }
  pending_.clear();
  jobs_.clear();  // ~Job joins each engine and unmaps its memory
  bound_.clear();
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
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, p] : pending_) {
    for (const auto& r : p.ranks) {
      if (r) next = std::min(next, r->deadline);
    }
  }
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
  }
}

void JobManager::ExpireAttaches(absl::Time now) {
  std::vector<std::string> emptied;
  for (auto& [id, p] : pending_) {
    std::vector<int> missing;
    for (int r = 0; r < p.world; ++r) {
      if (!p.ranks[r]) missing.push_back(r);
    }
    for (int r = 0; r < p.world; ++r) {
      auto& slot = p.ranks[r];
      if (!slot || slot->deadline > now) continue;
      std::move(slot->done)(absl::DeadlineExceededError(absl::StrCat(
          "job '", id, "': local rank ", r,
          " timed out waiting for the other local ranks to attach; missing "
          "local rank",
          missing.size() == 1 ? " " : "s ", absl::StrJoin(missing, ", "),
          " of local world size ", p.world)));
      bound_.erase(slot->request.session_id());
      slot.reset();
      --p.count;
    }
    if (p.count == 0) emptied.push_back(id);
  }
  for (const std::string& id : emptied) pending_.erase(id);
}

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
  if (auto it = bound_.find(sid); it != bound_.end()) {
    std::move(done)(absl::AlreadyExistsError(
        absl::StrCat("session ", sid, " is already attached as local rank ",
                     it->second.second, " of job '", it->second.first,
                     "'; each rank needs its own session")));
    return;
  }
  if (!sessions_->IsLive(sid)) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        who, ": session ", sid,
        " is not connected; connect to the daemon's session socket first and "
        "pass the session id it sends")));
    return;
  }
  if (auto it = jobs_.find(id); it != jobs_.end()) {
    const ActiveJob& active = it->second;
    if (rank < static_cast<int>(active.sessions.size()) &&
        active.sessions[rank] != 0) {
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
      std::move(done)(absl::ResourceExhaustedError(
          absl::StrCat(who, ": the daemon already serves its maximum of ",
                       config_.max_jobs(), " jobs")));
      return;
    }
    PendingJob p;
    p.world = request.local_world_size();
    p.ranks.resize(p.world);
    it = pending_.emplace(id, std::move(p)).first;
  }
  PendingJob& p = it->second;
  if (p.world != request.local_world_size()) {
    std::move(done)(absl::InvalidArgumentError(
        absl::StrCat(who, " says local world size ", request.local_world_size(),
                     " but ranks already attached said ", p.world)));
    return;
  }
  if (p.ranks[rank]) {
    std::move(done)(absl::AlreadyExistsError(
        absl::StrCat(who, " is already attached (session ",
                     p.ranks[rank]->request.session_id(), ")")));
    return;
  }
  const absl::Time limit = std::min(
      deadline, absl::Now() + absl::Milliseconds(config_.attach_timeout_ms()));
  bound_[sid] = {id, rank};
  p.ranks[rank] = PendingRank{std::move(request), *std::move(params), limit,
                              std::move(done)};
  if (++p.count == p.world) FormJob(id);
}

void JobManager::FailPending(const std::string& job_id,
                             const absl::Status& status) {
  auto it = pending_.find(job_id);
  if (it == pending_.end()) return;
  PendingJob p = std::move(it->second);
  pending_.erase(it);
  for (auto& r : p.ranks) {
    if (!r) continue;
    bound_.erase(r->request.session_id());
    std::move(r->done)(status);
  }
}

void JobManager::FormJob(const std::string& job_id) {
  PendingJob& p = pending_.at(job_id);
  const PendingRank& first = *p.ranks[0];
  for (int r = 1; r < p.world; ++r) {
    const PendingRank& other = *p.ranks[r];
    absl::Status same = CompareModels(job_id, 0, first.params, r, other.params);
    if (same.ok() &&
        (CapOr(first.request.bucket_cap_mb(), config_.bucket_cap_mb()) !=
             CapOr(other.request.bucket_cap_mb(), config_.bucket_cap_mb()) ||
         CapOr(first.request.first_bucket_cap_mb(),
               config_.first_bucket_cap_mb()) !=
             CapOr(other.request.first_bucket_cap_mb(),
                   config_.first_bucket_cap_mb()))) {
      same = absl::InvalidArgumentError(absl::StrCat(
          "local ranks 0 and ", r, " of job '", job_id,
          "' asked for different bucket caps (", first.request.bucket_cap_mb(),
          "/", first.request.first_bucket_cap_mb(), " MiB vs ",
          other.request.bucket_cap_mb(), "/",
          other.request.first_bucket_cap_mb(), " MiB)"));
    }
    if (same.ok() &&
        first.request.broadcast_bytes() != other.request.broadcast_bytes()) {
      same = absl::InvalidArgumentError(
          absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                       "' asked for different broadcast areas (",
                       first.request.broadcast_bytes(), " vs ",
                       other.request.broadcast_bytes(), " bytes)"));
    }
    if (!same.ok()) {
      FailPending(job_id, same);
      return;
    }
  }

  PlannerOptions options;
  options.bucket_cap_bytes = static_cast<size_t>(
      CapOr(first.request.bucket_cap_mb(), config_.bucket_cap_mb()) * kMiB);
  options.first_bucket_cap_bytes =
      static_cast<size_t>(CapOr(first.request.first_bucket_cap_mb(),
                                config_.first_bucket_cap_mb()) *
                          kMiB);
  absl::StatusOr<BucketPlan> plan = PlanBuckets(first.params, options);
  if (!plan.ok()) {
    FailPending(job_id, absl::Status(plan.status().code(),
                                     absl::StrCat("job '", job_id, "': ",
                                                  plan.status().message())));
    return;
  }
  const uint64_t per_rank = plan->total_bytes + first.request.broadcast_bytes();
  if (per_rank * p.world > config_.max_job_memory_bytes()) {
    FailPending(job_id, absl::ResourceExhaustedError(absl::StrCat(
                            "job '", job_id, "' needs ", per_rank, " bytes x ",
                            p.world, " ranks; the daemon's per-job limit is ",
                            config_.max_job_memory_bytes())));
    return;
  }

  JobSpec spec;
  spec.job_id = job_id;
  spec.local_world_size = p.world;
  spec.params = first.params;
  spec.plan = *std::move(plan);
  spec.broadcast_bytes = first.request.broadcast_bytes();
  spec.spin = std::chrono::microseconds(config_.spin_us());
  absl::StatusOr<std::unique_ptr<BucketReducerInterface>> reducer =
      reducer_factory_(spec);
  absl::StatusOr<std::unique_ptr<Job>> job =
      reducer.ok() ? Job::Create(std::move(spec), *std::move(reducer))
                   : absl::StatusOr<std::unique_ptr<Job>>(reducer.status());
  if (!job.ok()) {
    FailPending(job_id, absl::Status(job.status().code(),
                                     absl::StrCat("job '", job_id, "': ",
                                                  job.status().message())));
    return;
  }

  // Hand every rank its memory before anyone's Attach returns, so a client
  // that sees OK can read its fds at once.
  std::vector<uint64_t> attach_ids(p.world);
  for (int r = 0; r < p.world; ++r) {
    attach_ids[r] = next_attach_id_++;
    absl::Status sent = sessions_->SendFds(p.ranks[r]->request.session_id(),
                                           attach_ids[r], (*job)->FdsFor(r));
    if (!sent.ok()) {
      FailPending(job_id,
                  absl::UnavailableError(absl::StrCat(
                      "local rank ", r, " of job '", job_id,
                      "' disconnected while attaching: ", sent.message())));
      return;
    }
  }
  (*job)->ReleaseFds();
  (*job)->Start();

  PendingJob ready = std::move(p);
  pending_.erase(job_id);
  ActiveJob active;
  active.job = *std::move(job);
  active.sessions.resize(ready.world);
  for (int r = 0; r < ready.world; ++r) {
    active.sessions[r] = ready.ranks[r]->request.session_id();
  }
  const Job& formed = *active.job;
  std::vector<v1::AttachResponse> responses;
  for (int r = 0; r < ready.world; ++r) {
    responses.push_back(formed.ResponseFor(r));
    responses.back().set_attach_id(attach_ids[r]);
  }
  jobs_.emplace(job_id, std::move(active));
  for (int r = 0; r < ready.world; ++r) {
    std::move(ready.ranks[r]->done)(std::move(responses[r]));
  }
}

void JobManager::RankGone(const std::string& job_id, int rank, bool detached) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  ActiveJob& active = it->second;
  bound_.erase(active.sessions[rank]);
  active.sessions[rank] = 0;
  active.job->RankGone(rank, detached);
  if (active.job->live_ranks() == 0) {
    jobs_.erase(it);  // joins the engine, releases the memory
  }
}

void JobManager::DoDetach(const v1::DetachRequest& request,
                          DetachCallback done) {
  const std::string who = absl::StrCat("local rank ", request.local_rank(),
                                       " of job '", request.job_id(), "'");
  auto it = bound_.find(request.session_id());
  if (it == bound_.end() || it->second.first != request.job_id() ||
      it->second.second != request.local_rank()) {
    std::move(done)(absl::NotFoundError(absl::StrCat(
        who, " is not attached through session ", request.session_id())));
    return;
  }
  const std::string job_id = it->second.first;
  const int rank = it->second.second;
  if (auto p = pending_.find(job_id); p != pending_.end()) {
    auto& slot = p->second.ranks[rank];
    if (slot) {
      std::move(slot->done)(absl::CancelledError(
          absl::StrCat(who, " detached before the job formed")));
      slot.reset();
      bound_.erase(request.session_id());
      if (--p->second.count == 0) pending_.erase(p);
    }
  } else {
    RankGone(job_id, rank, /*detached=*/true);
  }
  std::move(done)(absl::OkStatus());
}

void JobManager::DoSessionClosed(uint64_t session_id) {
  auto it = bound_.find(session_id);
  if (it == bound_.end()) return;  // never attached, or detached already
  const std::string job_id = it->second.first;
  const int rank = it->second.second;
  if (auto p = pending_.find(job_id); p != pending_.end()) {
    auto& slot = p->second.ranks[rank];
    if (slot) {
      std::move(slot->done)(absl::UnavailableError(
          absl::StrCat("local rank ", rank, " of job '", job_id,
                       "' closed its session while attaching")));
      slot.reset();
      if (--p->second.count == 0) pending_.erase(p);
    }
    bound_.erase(session_id);
    return;
  }
  RankGone(job_id, rank, /*detached=*/false);
}

}  // namespace gradd
