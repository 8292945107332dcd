#include "server/engine/job/rebuild.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/engine/formation/bucket_specs.h"
#include "server/engine/job/bucket_autotune.h"
#include "server/logging.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {
namespace {

// How often a wait re-checks cancellation and the job's failure.
constexpr absl::Duration kSlice = absl::Milliseconds(100);

// " 3" or "s 1, 3", to follow "rank" / "node rank".
std::string MissingList(const std::vector<int>& missing) {
  return absl::StrCat(missing.size() == 1 ? " " : "s ",
                      absl::StrJoin(missing, ", "));
}

}  // namespace

v1::RebuildBucketsResponse RebuildResponse(const BucketPlan& plan,
                                           uint64_t first_iteration) {
  v1::RebuildBucketsResponse resp;
  AppendBucketSpecs(plan, resp.mutable_buckets());
  resp.set_first_iteration(first_iteration);
  return resp;
}

std::string PlanFingerprint(const BucketPlan& plan) {
  std::string out;
  for (const Bucket& b : plan.buckets) {
    absl::StrAppend(&out, static_cast<int>(b.dtype), ":",
                    absl::StrJoin(b.params, ","), ";");
  }
  return out;
}

absl::StatusOr<v1::RebuildOrder> AgreeOnRebuild(
    RendezvousStoreInterface& store, const RebuildAgreement& a,
    const v1::RebuildOrder& mine,
    const std::function<absl::StatusOr<std::string>(const v1::RebuildOrder&)>&
        plan_fingerprint) {
  const std::string job = absl::StrCat("job '", a.job_id, "'");
  const std::string base = absl::StrCat(a.prefix, "/rebuild/");
  const absl::Time deadline = absl::Now() + a.timeout;
  auto cancelled = [&] { return a.cancelled && a.cancelled(); };
  // Blocking store calls in slices, so a cancelled rebuild stops soon.
  auto get = [&](const std::string& key) -> absl::StatusOr<std::string> {
    while (true) {
      if (cancelled()) {
        return absl::CancelledError(
            absl::StrCat(job, ": bucket rebuild cancelled"));
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(key);
      }
      absl::StatusOr<std::string> v =
          store.Get(a.job_id, key, std::min(left, kSlice));
      if (v.ok() || v.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return v;
      }
    }
  };

  if (a.node_rank == 0) {
    RETURN_IF_ERROR(
        store.Set(a.job_id, base + "order", mine.SerializeAsString()));
  }
  absl::StatusOr<std::string> bytes = get(base + "order");
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(absl::StrCat(
          job, ": node rank 0 did not ask to rebuild buckets within ",
          absl::FormatDuration(a.timeout), " of node rank ", a.node_rank,
          " asking after iteration ", mine.iteration()));
    }
    return bytes.status();
  }
  v1::RebuildOrder chosen;
  if (!chosen.ParseFromString(*bytes)) {
    return absl::InternalError(
        absl::StrCat(job, ": node rank 0's bucket rebuild order is malformed"));
  }
  if (chosen.iteration() != mine.iteration()) {
    return absl::FailedPreconditionError(
        absl::StrCat(job, ": node rank 0 rebuilds buckets after iteration ",
                     chosen.iteration(), " but node rank ", a.node_rank,
                     " after iteration ", mine.iteration()));
  }
  ASSIGN_OR_RETURN(std::string fingerprint, plan_fingerprint(chosen));
  RETURN_IF_ERROR(store.Set(a.job_id, absl::StrCat(base, "ack/", a.node_rank),
                            fingerprint));
  std::vector<int> missing;
  for (int n = 0; n < a.num_nodes; ++n) {
    absl::StatusOr<std::string> ack = get(absl::StrCat(base, "ack/", n));
    if (ack.ok()) {
      if (*ack != fingerprint) {
        return absl::FailedPreconditionError(absl::StrCat(
            job, ": node ranks ", a.node_rank, " and ", n,
            " planned different buckets from node rank 0's ready order"));
      }
      continue;
    }
    if (ack.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return ack.status();
    }
    missing.push_back(n);
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        job, ": node rank", MissingList(missing),
        " did not rebuild buckets after iteration ", mine.iteration(),
        " within ", absl::FormatDuration(a.timeout),
        " (every rank of every node must rebuild)"));
  }
  return chosen;
}

RebuildCoordinator::RebuildCoordinator(Job* job, RebuildOptions options)
    : job_(job), options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  ranks_.resize(job_->local_world_size());
}

RebuildCoordinator::~RebuildCoordinator() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // Never started (or answered already): nobody is left waiting, except
  // ranks that asked after the rebuild finished, answered at once.
}

std::string RebuildCoordinator::JobName() const {
  return absl::StrCat("job '", job_->id(), "'");
}

bool RebuildCoordinator::rebuilt() const {
  absl::MutexLock lock(&mu_);
  return rebuilt_;
}

bool RebuildCoordinator::in_progress() const {
  absl::MutexLock lock(&mu_);
  return count_ > 0 && !finished_;
}

RebuildCoordinator::Record RebuildCoordinator::record() const {
  absl::MutexLock lock(&mu_);
  Record r;
  r.rebuilt = rebuilt_;
  if (rebuilt_) {
    r.iteration = rebuilt_after_;
    r.ready_order = ready_order_;
  }
  return r;
}

void RebuildCoordinator::Add(v1::RebuildBucketsRequest request,
                             absl::Time deadline, Callback done) {
  const int rank = request.local_rank();
  const std::string who = absl::StrCat("local rank ", rank, " of ", JobName());
  bool next_round = false;
  {
    absl::MutexLock lock(&mu_);
    next_round = finished_ && rebuilt_ && next_switch_after_ != 0;
  }
  // Autotune's next switch: the last round's thread has answered everyone
  // and is ending (only this thread starts and joins it).
  if (next_round && thread_.joinable()) thread_.join();
  absl::MutexLock lock(&mu_);
  if (next_round && finished_) {
    finished_ = false;
    started_ = false;
    count_ = 0;
    abort_ = absl::OkStatus();
    ++round_;
  }
  if (finished_) {
    std::move(done)(absl::FailedPreconditionError(
        absl::StrCat(who, " asked to rebuild buckets, but the job ",
                     rebuilt_ ? "rebuilt them already (buckets are rebuilt "
                                "once)"
                              : "failed to rebuild them")));
    return;
  }
  if (ranks_[rank].has_value()) {
    std::move(done)(absl::FailedPreconditionError(
        absl::StrCat(who, " asked to rebuild buckets twice")));
    return;
  }
  if (count_ == 0) {
    iteration_ = request.iteration();
    local_deadline_ = absl::Now() + options_.local_timeout;
    // From now on a rank that goes on into the next iteration instead of
    // rebuilding fails the job at once instead of at the timeout.
    job_->ExpectRebuild(iteration_);
  }
  local_deadline_ = std::min(local_deadline_, deadline);
  ranks_[rank] = Waiting{std::move(request), deadline, std::move(done)};
  ++count_;
  if (!started_) {
    started_ = true;
    thread_ = std::thread([this] { Run(); });
  }
}

void RebuildCoordinator::RankGone(int rank) {
  absl::MutexLock lock(&mu_);
  if (finished_ || !abort_.ok()) return;
  // Also before anyone asked: a rebuild asked for later cannot complete
  // without this rank, so it fails at once rather than at the timeout.
  abort_ = absl::AbortedError(absl::StrCat(
      "local rank ", rank, " of ", JobName(),
      count_ > 0 ? " left while the job was rebuilding its buckets"
                 : " left; the job cannot rebuild its buckets without it"));
}

void RebuildCoordinator::Run() {
  uint64_t iteration = 0;
  {
    absl::MutexLock lock(&mu_);
    iteration = iteration_;
  }
  absl::StatusOr<Decision> decision = Decide();
  if (decision.ok()) {
    absl::Status switched =
        Switch(iteration, decision->plan, decision->partition_bytes);
    if (!switched.ok()) decision = switched;
  }
  Finish(decision, iteration);
}

absl::StatusOr<BucketPlan> RebuildCoordinator::PlanFor(
    const v1::RebuildOrder& o) const {
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = o.first_bucket_cap_bytes();
  caps.bucket_cap_bytes = o.bucket_cap_bytes();
  std::vector<int32_t> order(o.ready_order().begin(), o.ready_order().end());
  absl::StatusOr<BucketPlan> plan =
      PlanBucketsInOrder(job_->spec().params, order, caps);
  if (!plan.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(JobName(),
                     ": cannot rebuild buckets from local rank "
                     "0's ready order: ",
                     plan.status().message()));
  }
  return plan;
}

namespace {

std::string Mib(size_t bytes) {
  return absl::StrCat(static_cast<double>(bytes) / (1 << 20), " MiB");
}

std::optional<size_t> PartitionOf(const v1::RebuildOrder& o) {
  if (!o.has_partition_bytes()) return std::nullopt;
  return static_cast<size_t>(o.partition_bytes());
}

// ", partition 1 MiB" for a partition trial or setting.
std::string PartitionText(const std::optional<size_t>& bytes) {
  if (!bytes.has_value()) return "";
  return *bytes == 0 ? ", whole buckets on the network"
                     : absl::StrCat(", partition ", Mib(*bytes));
}

}  // namespace

void RebuildCoordinator::ChooseCaps(int round, uint64_t k,
                                    const std::vector<int32_t>& order,
                                    v1::RebuildOrder* mine) {
  const JobSpec& spec = job_->spec();
  mine->set_iteration(k);
  mine->set_first_bucket_cap_bytes(spec.planner.first_bucket_cap_bytes);
  mine->set_bucket_cap_bytes(spec.planner.bucket_cap_bytes);
  *mine->mutable_ready_order() = {order.begin(), order.end()};
  AutotuneRecord* tune = job_->autotune();
  // Other nodes take node rank 0's caps and schedule (Decide).
  if (tune == nullptr || spec.node_rank != 0) return;
  BucketAutotune::Setting s;
  if (round == 0) {
    // Caps that give the same plan as one before them are not tried.
    std::vector<size_t> distinct;
    std::vector<std::string> seen;
    for (size_t cap : tune->options().caps) {
      v1::RebuildOrder o = *mine;
      o.set_bucket_cap_bytes(cap);
      absl::StatusOr<BucketPlan> plan = PlanFor(o);
      if (!plan.ok()) continue;
      std::string print = PlanFingerprint(*plan);
      if (std::find(seen.begin(), seen.end(), print) != seen.end()) continue;
      seen.push_back(std::move(print));
      distinct.push_back(cap);
    }
    s = tune->Start(k, distinct);
    std::vector<std::string> names;
    for (size_t cap : distinct) names.push_back(Mib(cap));
    spdlog::info(
        "{} autotune: trying bucket caps of {} ({} + {} iterations each)",
        JobName(), absl::StrJoin(names, ", "),
        tune->options().warmup_iterations, tune->options().measured_iterations);
  } else {
    s = tune->Next(k);
    const AutotuneSnapshot now = tune->Snapshot();
    if (!now.trials_done.empty()) {
      const BucketAutotune::Trial& t = now.trials_done.back();
      spdlog::info(
          "{} autotune trial {}/{}: {} cap{}, median step {} ms over {} "
          "iterations",
          JobName(), now.trials_done.size(),
          s.trials > 0 ? s.trials : static_cast<int>(now.trials_done.size()),
          Mib(t.cap_bytes), PartitionText(t.partition_bytes),
          static_cast<double>(t.step_ns) / 1e6, t.iterations);
    }
  }
  if (s.next_switch_after == 0) {
    const AutotuneSnapshot now = tune->Snapshot();
    std::vector<std::string> tried;
    for (const BucketAutotune::Trial& t : now.trials_done) {
      tried.push_back(
          absl::StrCat(Mib(t.cap_bytes), PartitionText(t.partition_bytes), ": ",
                       static_cast<double>(t.step_ns) / 1e6, " ms"));
    }
    spdlog::info(
        "{} autotune settled on a {} bucket cap{} after iteration {} ({}{})",
        JobName(), Mib(s.cap_bytes), PartitionText(s.partition_bytes), k,
        tried.empty() ? now.note : absl::StrJoin(tried, ", "),
        now.note.empty() || tried.empty() ? "" : "; " + now.note);
  }
  mine->set_bucket_cap_bytes(s.cap_bytes);
  if (s.partition_bytes.has_value()) {
    mine->set_partition_bytes(*s.partition_bytes);
  }
  mine->set_next_switch_after(s.next_switch_after);
  mine->set_trial(static_cast<uint32_t>(s.trial));
  mine->set_trials(static_cast<uint32_t>(s.trials));
}

absl::StatusOr<RebuildCoordinator::Decision> RebuildCoordinator::Decide() {
  const JobSpec& spec = job_->spec();
  const int world = spec.local_world_size;
  v1::RebuildBucketsRequest first;
  absl::Time answer_by = absl::InfiniteFuture();
  int round = 0;
  uint64_t expected = 0;
  std::vector<int32_t> rebuilt_order;
  // 1. Every local rank.
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return cancelled_ || !abort_.ok() ||
               count_ == static_cast<int>(ranks_.size());
      };
      mu_.AwaitWithDeadline(absl::Condition(&settled),
                            std::min(local_deadline_, absl::Now() + kSlice));
      if (cancelled_) {
        return absl::CancelledError(
            absl::StrCat(JobName(), " stopped while rebuilding its buckets"));
      }
      // The job's own error first: a rank that failed on the data path and
      // then left is reported for the failure, not for leaving.
      if (!job_->status().ok()) return job_->status();
      if (!abort_.ok()) return abort_;
      if (count_ == world) break;
      if (absl::Now() >= local_deadline_) {
        std::vector<int> missing;
        int asked = -1;
        for (int r = 0; r < world; ++r) {
          if (!ranks_[r].has_value())
            missing.push_back(r);
          else if (asked < 0)
            asked = r;
        }
        return absl::DeadlineExceededError(absl::StrCat(
            JobName(), ": local rank", MissingList(missing),
            " did not ask to rebuild buckets after iteration ", iteration_,
            " in time, while local rank ", asked,
            " waited (every rank must call RebuildBuckets at the same "
            "point)"));
      }
    }
    for (int r = 0; r < world; ++r) {
      const v1::RebuildBucketsRequest& req = ranks_[r]->request;
      if (req.iteration() != ranks_[0]->request.iteration()) {
        return absl::FailedPreconditionError(absl::StrCat(
            JobName(), ": local rank 0 rebuilds buckets after iteration ",
            ranks_[0]->request.iteration(), " but local rank ", r,
            " after iteration ", req.iteration()));
      }
      if (static_cast<size_t>(req.ready_order_size()) != spec.params.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("local rank ", r, " of ", JobName(),
                         " sent a ready order of ", req.ready_order_size(),
                         " parameters; the model has ", spec.params.size()));
      }
    }
    first = ranks_[0]->request;
    for (const auto& r : ranks_) answer_by = std::min(answer_by, r->deadline);
    round = round_;
    expected = next_switch_after_;
    rebuilt_order = ready_order_;
  }
  if (round > 0 && first.iteration() != expected) {
    return absl::FailedPreconditionError(absl::StrCat(
        JobName(), ": the ranks asked to switch plans after iteration ",
        first.iteration(), " but autotune's next switch is after iteration ",
        expected));
  }
  // 2. This node's choice: local rank 0's order (autotune's later
  // rounds: the rebuilt one) with the job's caps or autotune's.
  v1::RebuildOrder mine;
  ChooseCaps(round, first.iteration(),
             round == 0 ? std::vector<int32_t>(first.ready_order().begin(),
                                               first.ready_order().end())
                        : rebuilt_order,
             &mine);
  ASSIGN_OR_RETURN(BucketPlan plan, PlanFor(mine));
  auto decided = [this](const v1::RebuildOrder& o) {
    absl::MutexLock lock(&mu_);
    ready_order_.assign(o.ready_order().begin(), o.ready_order().end());
  };
  // What the job's events say of autotune's switch.
  auto event = [this](const v1::RebuildOrder& o) {
    std::optional<AutotuneEvent> e;
    if (job_->autotune() == nullptr) return e;
    e.emplace();
    e->iteration = o.iteration();
    e->bucket_cap_bytes = o.bucket_cap_bytes();
    e->trial = static_cast<int>(o.trial());
    e->trials = static_cast<int>(o.trials());
    e->settled = o.next_switch_after() == 0;
    return e;
  };
  if (spec.num_nodes <= 1 || !options_.store_factory) {
    decided(mine);
    return Decision{std::move(plan), mine.next_switch_after(), event(mine),
                    PartitionOf(mine)};
  }

  // 3. Multi-node: node rank 0's choice wins.
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStoreInterface> store,
                   options_.store_factory());
  RebuildAgreement agreement;
  agreement.job_id = spec.job_id;
  agreement.prefix = round == 0
                         ? options_.round_prefix
                         : absl::StrCat(options_.round_prefix, "/tune", round);
  agreement.node_rank = spec.node_rank;
  agreement.num_nodes = spec.num_nodes;
  // Give up a little before the ranks' own deadlines, so they read the
  // reason rather than a bare timeout.
  agreement.timeout = std::min(
      options_.node_timeout, answer_by - absl::Now() - absl::Milliseconds(300));
  agreement.cancelled = [this] {
    absl::MutexLock lock(&mu_);
    return cancelled_ || !abort_.ok() || !job_->status().ok();
  };
  ASSIGN_OR_RETURN(
      v1::RebuildOrder chosen,
      AgreeOnRebuild(
          *store, agreement, mine,
          [&](const v1::RebuildOrder& o) -> absl::StatusOr<std::string> {
            ASSIGN_OR_RETURN(BucketPlan p, PlanFor(o));
            return PlanFingerprint(p);
          }));
  decided(chosen);
  if (AutotuneRecord* tune = job_->autotune();
      tune != nullptr && spec.node_rank != 0) {
    BucketAutotune::Setting s;
    s.cap_bytes = chosen.bucket_cap_bytes();
    s.next_switch_after = chosen.next_switch_after();
    s.trial = static_cast<int>(chosen.trial());
    s.trials = static_cast<int>(chosen.trials());
    s.partition_bytes = PartitionOf(chosen);
    tune->Follow(chosen.iteration(), s);
  }
  ASSIGN_OR_RETURN(BucketPlan chosen_plan, PlanFor(chosen));
  return Decision{std::move(chosen_plan), chosen.next_switch_after(),
                  event(chosen), PartitionOf(chosen)};
}

absl::Status RebuildCoordinator::Switch(uint64_t iteration, BucketPlan plan,
                                        std::optional<size_t> partition_bytes) {
  // The result outlives this call: the engine may answer after we gave up.
  struct Result {
    absl::Mutex mu;
    std::optional<absl::Status> status ABSL_GUARDED_BY(mu);
  };
  auto result = std::make_shared<Result>();
  job_->SwitchPlan(
      iteration, std::move(plan),
      [result](absl::Status s) {
        absl::MutexLock lock(&result->mu);
        result->status = std::move(s);
      },
      partition_bytes);
  const absl::Time deadline = absl::Now() + options_.switch_timeout;
  while (true) {
    {
      absl::MutexLock lock(&result->mu);
      auto has = [&result]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(result->mu) {
        return result->status.has_value();
      };
      if (result->mu.AwaitWithDeadline(
              absl::Condition(&has),
              std::min(deadline, absl::Now() + kSlice))) {
        return *result->status;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        return absl::CancelledError(absl::StrCat(
            JobName(), " stopped while switching to the rebuilt buckets"));
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          JobName(), ": the engine did not reach the end of iteration ",
          iteration, " within ", absl::FormatDuration(options_.switch_timeout),
          " to switch to the rebuilt buckets"));
    }
  }
}

void RebuildCoordinator::Finish(const absl::StatusOr<Decision>& decision,
                                uint64_t iteration) {
  std::vector<Callback> callbacks;
  int round = 0;
  const uint64_t next = decision.ok() ? decision->next_switch_after : 0;
  {
    absl::MutexLock lock(&mu_);
    finished_ = true;
    round = round_;
    if (round == 0) {
      rebuilt_ = decision.ok();
      rebuilt_after_ = iteration;
    } else if (!decision.ok()) {
      rebuilt_ = false;
    }
    next_switch_after_ = next;
    for (auto& r : ranks_) {
      if (r.has_value()) callbacks.push_back(std::move(r->done));
      r.reset();
    }
  }
  if (!decision.ok()) {
    // Other ranks may be blocked on the data path (or about to be): the
    // job cannot go on with ranks on different plans.
    if (AutotuneRecord* tune = job_->autotune(); tune != nullptr) {
      tune->Stop(std::string(decision.status().message()));
    }
    job_->Fail(decision.status().code(),
               absl::StrCat(round == 0 ? "bucket rebuild failed: "
                                       : "autotune's plan switch failed: ",
                            decision.status().message()));
    for (Callback& cb : callbacks) std::move(cb)(decision.status());
    return;
  }
  std::vector<size_t> sizes;
  for (const Bucket& b : decision->plan.buckets) sizes.push_back(b.size_bytes);
  spdlog::info("{} {} after iteration {}: {} buckets of {} bytes", JobName(),
               round == 0 ? "rebuilt its buckets" : "switched plans (autotune)",
               iteration, sizes.size(), absl::StrJoin(sizes, ", "));
  v1::RebuildBucketsResponse resp =
      RebuildResponse(decision->plan, iteration + 1);
  resp.set_next_switch_after(next);
  // From now on a rank that runs past the next switch instead of asking
  // fails the job at once (as for the rebuild).
  if (next != 0) job_->ExpectRebuild(next);
  if (decision->autotune.has_value()) job_->ReportAutotune(*decision->autotune);
  for (Callback& cb : callbacks) std::move(cb)(resp);
}

// The job's bucket-rebuild coordinator: local waits bounded like attaches,
// multi-node agreement through the coordinator the job formed through,
// bounded like the formation.
std::unique_ptr<RebuildCoordinator> MakeRebuildCoordinator(
    Job* job, const v1::DaemonConfig& config,
    std::shared_ptr<const CoordinatorSelector> coordinators) {
  RebuildOptions options;
  options.local_timeout = absl::Milliseconds(config.attach_timeout_ms());
  options.node_timeout =
      absl::Milliseconds(config.rendezvous().formation_timeout_ms());
  options.switch_timeout =
      absl::Milliseconds(config.rendezvous().collective_timeout_ms());
  const JobSpec& spec = job->spec();
  if (spec.num_nodes > 1) {
    options.round_prefix = spec.round_prefix;
    options.store_factory = [address = spec.coordinator,
                             timeout = options.node_timeout, coordinators]()
        -> absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> {
      return coordinators->Connect(address, timeout);
    };
  }
  return std::make_unique<RebuildCoordinator>(job, std::move(options));
}

}  // namespace gradd
