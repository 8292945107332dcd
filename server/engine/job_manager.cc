#include "server/engine/job_manager.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/config.h"
#include "server/engine/device_attach.h"
#include "server/engine/device_reducer.h"
#include "server/engine/hierarchical_reducer.h"
#include "server/engine/job_memory.h"
#include "server/hooks/comm_hook_factory.h"
#include "server/logging.h"
#include "server/rendezvous/host_addresses.h"
#include "server/rendezvous/rendezvous_client.h"

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
                      std::string(DTypeName(p.dtype)),
                      p.device == DeviceKind::kCpu ? "" : " on cuda");
}

bool SameParam(const ParamInfo& a, const ParamInfo& b) {
  return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype &&
         a.device == b.device;
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

constexpr int kMaxNodes = 65536;
constexpr size_t kMaxNodeIdBytes = 256;
// A formation gives up this much before the earliest Attach deadline of its
// ranks, so they read the rendezvous' reason rather than a bare timeout.
constexpr absl::Duration kFormationMargin = absl::Milliseconds(500);

int NumNodes(const v1::AttachRequest& r) { return std::max(1, r.num_nodes()); }

// What the local ranks of one node must agree on for a multi-node job.
std::string NodeSetup(const v1::AttachRequest& r) {
  return absl::StrCat(
      "num_nodes ", NumNodes(r), ", node rank ",
      r.has_node_rank() ? absl::StrCat(r.node_rank()) : std::string("auto"),
      ", node id '", r.node_id(), "', coordinator '", r.coordinator(), "'");
}

void Log(const std::string& line) { spdlog::info("{}", line); }

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
  if (req.num_nodes() < 0 || req.num_nodes() > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": num_nodes ", req.num_nodes(), " is outside 0..",
                     kMaxNodes, " (0 = single node)"));
  }
  if (req.has_node_rank() &&
      (req.node_rank() < 0 || req.node_rank() >= NumNodes(req))) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": node rank ", req.node_rank(),
                     " is out of range for ", NumNodes(req), " node(s)"));
  }
  if (req.node_id().size() > kMaxNodeIdBytes ||
      !std::all_of(req.node_id().begin(), req.node_id().end(), JobIdChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": node id '", absl::CEscape(req.node_id()),
                     "' must be at most 256 letters, digits and ._:@/+=-"));
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
  // No parameters: a collective-only job (e.g. a torch.distributed process
  // group), which only makes sense with a collective area.
  if (req.params().empty() && req.broadcast_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who,
                     " registered no parameters and no collective area "
                     "(broadcast_bytes 0); a collective-only job needs "
                     "collective_bytes > 0"));
  }
  RETURN_IF_ERROR(ValidateCommHookSpec(req.comm_hook(), who));
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
    absl::StatusOr<DeviceKind> device = DeviceKindFromInt(p.device());
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": parameter '", p.name(), "' (index ", i,
                       "): ", device.status().message()));
    }
    if (*device == DeviceKind::kCuda && req.cuda_device().uuid().size() != 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": parameter '", p.name(), "' is on CUDA but the attach names ",
          req.has_cuda_device() ? "a GPU UUID that is not 16 bytes" : "no GPU",
          " (AttachRequest.cuda_device)"));
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
    params.push_back(ParamInfo{
        p.name(), {p.shape().begin(), p.shape().end()}, *dtype, *device});
  }
  return params;
}

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
  auto it = bound_.find(request.session_id());
  auto job = jobs_.find(request.job_id());
  if (it == bound_.end() || it->second.first != request.job_id() ||
      it->second.second != request.local_rank() || job == jobs_.end()) {
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
    for (auto& r : p.ranks) {
      if (r) std::move(r->done)(absl::UnavailableError("gradd daemon stopped"));
    }
  }
  pending_.clear();
  jobs_.clear();  // ~Job joins each engine and unmaps its memory
  bound_.clear();
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
  for (const auto& [id, p] : pending_) {
    if (p.formation != 0) continue;  // the formation answers them
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
    Beat(absl::Now());
    watchdog_.Tick(absl::Now());
  }
}

void JobManager::Beat(absl::Time now) {
  if (now < next_heartbeat_) return;
  for (auto& [id, active] : jobs_) active.job->Heartbeat();
  next_heartbeat_ = now + absl::Milliseconds(config_.heartbeat_interval_ms());
}

void JobManager::ExpireAttaches(absl::Time now) {
  std::vector<std::string> emptied;
  for (auto& [id, p] : pending_) {
    if (p.formation != 0) continue;  // bounded by the formation itself
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
  if (!sessions_->Claim(sid)) {
    std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        who, ": session ", sid,
        " is not connected; connect to the daemon's session socket first and "
        "pass the session id it sends")));
    return;
  }
  absl::StatusOr<int> device =
      ResolveRankDevice(request, *params, *devices_, who);
  if (!device.ok()) {
    std::move(done)(device.status());
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
                              std::move(done), *device};
  if (++p.count == p.world) FormJob(id);
}

void JobManager::FailPending(const std::string& job_id,
                             const absl::Status& status) {
  auto it = pending_.find(job_id);
  if (it == pending_.end()) return;
  spdlog::error("job '{}' failed to form: {}", job_id, status.ToString());
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
    if (same.ok() && !google::protobuf::util::MessageDifferencer::Equals(
                         NormalizeCommHookSpec(first.request.comm_hook()),
                         NormalizeCommHookSpec(other.request.comm_hook()))) {
      same = absl::InvalidArgumentError(
          absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                       "' asked for different communication hooks ('",
                       DescribeCommHook(first.request.comm_hook()), "' vs '",
                       DescribeCommHook(other.request.comm_hook()), "')"));
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
  for (const auto& r : p.ranks) rank_devices.push_back(r->device);
  if (absl::Status s = CheckJobMemory(
          job_id,
          JobMemoryNeedOf(first.params, *plan, first.request.broadcast_bytes(),
                          rank_devices, NumNodes(first.request)),
          config_.max_job_memory_bytes());
      !s.ok()) {
    FailPending(job_id, s);
    return;
  }

  for (int r = 1; r < p.world; ++r) {
    const v1::AttachRequest& other = p.ranks[r]->request;
    if (NodeSetup(first.request) != NodeSetup(other)) {
      FailPending(job_id,
                  absl::InvalidArgumentError(absl::StrCat(
                      "local ranks 0 and ", r, " of job '", job_id,
                      "' disagree on the multi-node setup: ",
                      NodeSetup(first.request), " vs ", NodeSetup(other))));
      return;
    }
  }

  JobSpec spec;
  spec.job_id = job_id;
  spec.local_world_size = p.world;
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
  if (NumNodes(first.request) > 1) {
    StartNodeFormation(job_id, std::move(spec));
    return;
  }
  absl::StatusOr<std::unique_ptr<BucketReducerInterface>> reducer =
      reducer_factory_(spec);
  Activate(job_id, std::move(spec), std::move(reducer));
}

void JobManager::StartNodeFormation(const std::string& job_id, JobSpec spec) {
  PendingJob& p = pending_.at(job_id);
  const v1::AttachRequest& request = p.ranks[0]->request;
  const v1::RendezvousConfig& rv = config_.rendezvous();
  absl::Time limit = absl::InfiniteFuture();
  for (const auto& r : p.ranks) limit = std::min(limit, r->deadline);

  NodeFormationOptions options;
  options.job_id = job_id;
  options.node_id =
      request.node_id().empty() ? config_.node_id() : request.node_id();
  if (request.has_node_rank()) options.node_rank = request.node_rank();
  options.num_nodes = request.num_nodes();
  options.local_world_size = p.world;
  options.params = spec.params;
  options.local_plan = spec.plan;
  options.join_timeout = std::min(absl::Milliseconds(rv.join_timeout_ms()),
                                  limit - absl::Now() - kFormationMargin);
  options.collective_timeout = absl::Milliseconds(rv.collective_timeout_ms());
  for (absl::string_view id :
       absl::StrSplit(rv.expected_node_ids(), ',', absl::SkipWhitespace())) {
    options.expected_node_ids.emplace_back(absl::StripAsciiWhitespace(id));
  }
  if (options.join_timeout <= absl::ZeroDuration()) {
    FailPending(job_id, absl::DeadlineExceededError(absl::StrCat(
                            "job '", job_id,
                            "': no time left before the Attach deadline to "
                            "rendezvous with the other nodes")));
    return;
  }
  const uint64_t formation = next_formation_++;
  p.formation = formation;
  NcclJobPlatformInterface* nccl =
      UsesDeviceReducer(spec) ? DaemonNcclJobPlatform() : nullptr;
  // The rendezvous blocks (up to the join timeout) and so may finding the
  // coordinator (name resolution); both run on a thread of their own and
  // post back through the mailbox, which outlives this object, as does the
  // shared coordinator selector.
  std::thread([mailbox = mailbox_, options = std::move(options),
               requested = request.coordinator(), selector = coordinators_,
               advertise = rv.advertise_host(), ifname = rv.interface(),
               spec = std::move(spec), job_id, formation, nccl,
               limit = limit - kFormationMargin]() mutable {
    absl::StatusOr<FormedNodes> result = [&]() -> absl::StatusOr<FormedNodes> {
      absl::StatusOr<std::string> found = selector->Resolve(requested);
      if (!found.ok()) {
        return absl::Status(
            found.status().code(),
            absl::StrCat("job '", job_id, "' spans ", options.num_nodes,
                         " nodes but ", found.status().message()));
      }
      const std::string coordinator = *std::move(found);
      absl::StatusOr<std::string> advertised =
          AdvertiseAddress(advertise, ifname, coordinator);
      if (!advertised.ok()) {
        return absl::Status(advertised.status().code(),
                            absl::StrCat("job '", job_id,
                                         "': choosing the address the other "
                                         "nodes reach this one on: ",
                                         advertised.status().message()));
      }
      options.advertise_host = *std::move(advertised);
      Log(absl::StrCat("job '", job_id, "': node '", options.node_id,
                       "' joining ", options.num_nodes, " nodes through ",
                       coordinator, " (Gloo on ", options.advertise_host, ")"));
      ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> client,
                       selector->Connect(coordinator, options.join_timeout));
      ASSIGN_OR_RETURN(options.prefix, OpenRound(*client, job_id));
      absl::StatusOr<NodeFormation> formed = FormNodeJob(*client, options);
      FormedNodes out;
      if (formed.ok() && nccl != nullptr) {
        NcclJobSetupOptions setup;
        setup.job_id = job_id;
        setup.prefix = options.prefix;
        setup.node_rank = formed->layout.node_rank;
        setup.num_nodes = formed->layout.num_nodes;
        setup.timeout = options.collective_timeout;
        absl::StatusOr<std::shared_ptr<NcclJobSetup>> set_up =
            SetUpNcclBetweenNodes(*client, *nccl, std::move(setup),
                                  spec.rank_devices, limit);
        if (set_up.ok()) {
          out.nccl = *std::move(set_up);
        } else {
          formed = set_up.status();
        }
      }
      CloseRound(*client, job_id, options.prefix,
                 formed.ok() ? std::string("formed")
                             : std::string(formed.status().message()));
      if (!formed.ok()) return formed.status();
      out.formation = *std::move(formed);
      client->ReleaseRoundWhenDone(job_id, options.prefix, options.node_id,
                                   out.formation.layout.num_nodes);
      out.store = std::move(client);
      out.coordinator = coordinator;
      out.round_prefix = options.prefix;
      return out;
    }();
    absl::MutexLock lock(&mailbox->mu);
    if (mailbox->owner == nullptr) return;  // daemon stopped: drop it
    mailbox->owner->Post([owner = mailbox->owner, job_id, formation,
                          spec = std::move(spec),
                          result = std::move(result)]() mutable {
      owner->FinishNodeFormation(job_id, formation, std::move(spec),
                                 std::move(result));
    });
  }).detach();
}

void JobManager::FinishNodeFormation(const std::string& job_id,
                                     uint64_t formation, JobSpec spec,
                                     absl::StatusOr<FormedNodes> result) {
  auto it = pending_.find(job_id);
  if (it == pending_.end() || it->second.formation != formation) {
    return;  // its ranks left meanwhile; dropping the backend tells peers
  }
  if (!result.ok()) {
    FailPending(job_id, result.status());  // logs it, with the job's id
    return;
  }
  const JobLayout& layout = result->formation.layout;
  spec.plan = std::move(result->formation.plan);
  spec.node_rank = layout.node_rank;
  spec.num_nodes = layout.num_nodes;
  spec.global_rank_offset = layout.global_rank_offset;
  spec.world_size = layout.world_size;
  spec.node_ids = layout.NodeIds();
  spec.coordinator = result->coordinator;
  spec.round_prefix = result->round_prefix;
  spec.nccl_between_nodes = std::move(result->nccl);
  HierarchicalReducer::Options options;
  options.pool = pool_;
  options.num_buckets = static_cast<int>(spec.plan.buckets.size());
  for (const JobNode& node : layout.nodes) {
    options.node_offsets.push_back(node.global_rank_offset);
  }
  options.world_size = layout.world_size;
  options.job_id = job_id;
  options.store_prefix = result->round_prefix;
  options.agree_timeout =
      absl::Milliseconds(config_.rendezvous().collective_timeout_ms());
  Log(absl::StrCat(
      "job '", job_id, "' formed: node rank ", layout.node_rank, " of ",
      layout.num_nodes, " (", absl::StrJoin(layout.NodeIds(), ", "),
      "), global ranks ", layout.global_rank_offset, "..",
      layout.global_rank_offset + spec.local_world_size - 1, " of ",
      layout.world_size, ", ", spec.plan.buckets.size(), " buckets"));
  std::unique_ptr<BucketReducerInterface> reducer =
      std::make_unique<HierarchicalReducer>(
          std::move(options), std::move(result->formation.backend),
          std::move(result->store));
  Activate(job_id, std::move(spec), std::move(reducer));
}

void JobManager::Activate(
    const std::string& job_id, JobSpec spec,
    absl::StatusOr<std::unique_ptr<BucketReducerInterface>> reducer) {
  PendingJob& p = pending_.at(job_id);
  if (reducer.ok()) reducer = WrapDeviceReducer(spec, *std::move(reducer));
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
  if (events_ != nullptr) {
    JobInfo info;
    info.job_id = job_id;
    info.local_world_size = (*job)->local_world_size();
    info.node_rank = (*job)->spec().node_rank;
    info.num_nodes = (*job)->spec().num_nodes;
    info.shared_memory_bytes = (*job)->shared_memory_bytes();
    (*job)->AddEventSink(events_->OnJobStarted(info));
  }
  (*job)->Start();
  {
    const Job& j = **job;
    size_t bytes = 0;
    for (const Bucket& b : j.plan().buckets) bytes += b.size_bytes;
    spdlog::info(
        "job '{}' formed: {} local ranks, node {} of {}, world size {}, {} "
        "parameters in {} buckets ({} bytes per rank)",
        job_id, j.local_world_size(), j.spec().node_rank, j.spec().num_nodes,
        j.spec().global_world_size(), j.spec().params.size(),
        j.plan().buckets.size(), bytes);
  }

  PendingJob ready = std::move(p);
  pending_.erase(job_id);
  ActiveJob active;
  active.job = *std::move(job);
  active.rebuild =
      MakeRebuildCoordinator(active.job.get(), config_, coordinators_);
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
  active.rebuild->RankGone(rank);
  if (events_ != nullptr) events_->OnDetach(detached);
  if (active.job->live_ranks() == 0) {
    const ReducerStats st = active.job->reducer_stats();
    auto ms = [](uint64_t ns) { return absl::StrFormat("%.3f", ns / 1e6); };
    Log(absl::StrCat("job '", job_id, "' ended: ", st.buckets,
                     " buckets reduced; phase split ms: local_reduce=",
                     ms(st.local_reduce_ns), " network=", ms(st.network_ns),
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

absl::Status JobManager::CheckBound(uint64_t session_id,
                                    const std::string& job_id, int local_rank,
                                    absl::string_view who) const {
  auto it = bound_.find(session_id);
  if (it == bound_.end() || it->second.first != job_id ||
      it->second.second != local_rank) {
    return absl::NotFoundError(
        absl::StrCat(who, " is not attached through session ", session_id));
  }
  return absl::OkStatus();
}

void JobManager::DoRebuild(v1::RebuildBucketsRequest request,
                           absl::Time deadline, RebuildCallback done) {
  const std::string who = absl::StrCat("local rank ", request.local_rank(),
                                       " of job '", request.job_id(), "'");
  if (absl::Status bound = CheckBound(request.session_id(), request.job_id(),
                                      request.local_rank(), who);
      !bound.ok()) {
    std::move(done)(std::move(bound));
    return;
  }
  auto job = jobs_.find(request.job_id());
  if (job == jobs_.end()) {
    std::move(done)(absl::FailedPreconditionError(
        absl::StrCat(who, " asked to rebuild buckets before the job formed")));
    return;
  }
  job->second.rebuild->Add(std::move(request), deadline, std::move(done));
}

void JobManager::DoDetach(const v1::DetachRequest& request,
                          DetachCallback done) {
  const std::string who = absl::StrCat("local rank ", request.local_rank(),
                                       " of job '", request.job_id(), "'");
  if (absl::Status bound = CheckBound(request.session_id(), request.job_id(),
                                      request.local_rank(), who);
      !bound.ok()) {
    std::move(done)(std::move(bound));
    return;
  }
  const std::string job_id = request.job_id();
  const int rank = request.local_rank();
  if (auto p = pending_.find(job_id); p != pending_.end()) {
    auto& slot = p->second.ranks[rank];
    if (slot) {
      std::move(slot->done)(absl::CancelledError(
          absl::StrCat(who, " detached before the job formed")));
      slot.reset();
      bound_.erase(request.session_id());
      if (p->second.formation != 0) {
        FailPending(job_id, absl::AbortedError(absl::StrCat(
                                who,
                                " detached while the job was forming "
                                "with the other nodes")));
      } else if (--p->second.count == 0) {
        pending_.erase(p);
      }
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
      bound_.erase(session_id);
      if (p->second.formation != 0) {
        FailPending(job_id,
                    absl::AbortedError(absl::StrCat(
                        "local rank ", rank, " of job '", job_id,
                        "' closed its session while the job was forming with "
                        "the other nodes")));
      } else if (--p->second.count == 0) {
        pending_.erase(p);
      }
      return;
    }
    bound_.erase(session_id);
    return;
  }
  spdlog::warn("job '{}': local rank {} closed its session without detaching",
               job_id, rank);
  RankGone(job_id, rank, /*detached=*/false);
}

}  // namespace gradd
