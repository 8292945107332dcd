#include "server/engine/job/job.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/doorbell.h"
#include "common/status_macros.h"
#include "server/engine/formation/bucket_specs.h"
#include "server/logging.h"
#include "server/scheduling.h"

namespace gradd {
namespace {

constexpr size_t kPage = 4096;
// Upper bound on one engine sleep: liveness and stop are re-checked at least
// this often even if no doorbell rings (they also ring it themselves).
constexpr auto kMaxSleep = std::chrono::milliseconds(100);
// How often the engine looks for stalled buckets (when stalls are on).
constexpr int64_t kStallCheckNs = 50'000'000;

StallInspector::Options StallOptions(const JobSpec& spec) {
  StallInspector::Options o;
  o.job_id = spec.job_id;
  o.warning = spec.stall_warning;
  o.shutdown = spec.stall_shutdown;
  for (size_t k = 0; k < spec.node_ids.size(); ++k) {
    if (static_cast<int>(k) == spec.node_rank) continue;
    o.other_nodes.push_back(
        absl::StrCat("'", spec.node_ids[k], "' (node rank ", k, ")"));
  }
  if (o.other_nodes.empty() && spec.num_nodes > 1) {
    o.other_nodes.push_back(
        absl::StrCat("the job's ", spec.num_nodes - 1, " other nodes"));
  }
  return o;
}

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

ReformationDriver::Options ReformationOptions(const JobSpec& spec) {
  ReformationDriver::Options o;
  o.job_id = spec.job_id;
  o.enabled = spec.num_nodes > 1 &&
              (spec.min_nodes > 0 || spec.rank_restart_grace.count() > 0);
  o.formed_node_ids = spec.node_ids;
  o.formed_world_size = spec.global_world_size();
  o.divide_by_initial_world_size = spec.divide_by_initial_world_size;
  o.initial_world_size = spec.initial_global_world_size();
  // A node admitted into its running job: the reducer divides by the live
  // world size it was admitted into; a job that divides by the initial one
  // says so per bucket from the start, as its other nodes do since their
  // re-formation.
  o.bucket_divisor = EpochState::BucketDivisor(
      spec.divide_by_initial_world_size, spec.initial_world_size);
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Create(
    JobSpec spec, std::unique_ptr<BucketReducerInterface> reducer) {
  // A plan that came from node rank 0 over the wire carries no flags.
  MarkInternalBuckets(spec.params, &spec.plan);
  std::unique_ptr<Job> job(new Job(std::move(spec), std::move(reducer)));
  const JobSpec& s = job->spec_;
  const int world = s.local_world_size;

  ASSIGN_OR_RETURN(job->control_fd_,
                   CreateMemfdForSealing(absl::StrCat("gradd-ctl-", s.job_id),
                                         job->layout_.job_bytes()));
  std::vector<int> rank_control_fds;
  std::vector<int> bell_fds;
  for (int r = 0; r < world; ++r) {
    ASSIGN_OR_RETURN(
        UniqueFd fd,
        CreateSealedMemfd(absl::StrCat("gradd-ctl-", s.job_id, "-r", r),
                          job->layout_.rank_block_bytes()));
    rank_control_fds.push_back(fd.get());
    job->rank_control_fds_.push_back(std::move(fd));
    ASSIGN_OR_RETURN(BellPipe bell, CreateBell());
    bell_fds.push_back(bell.read_end.get());
    job->bells_.push_back(std::move(bell));
  }
  ASSIGN_OR_RETURN(job->control_, ControlMapping::Map(
                                      job->layout_, job->control_fd_.get(),
                                      /*job_writable=*/true, rank_control_fds));
  // Only now that our mapping exists: from here on nobody else can map the
  // job block writable, so trainers cannot touch done_seq, status or error.
  RETURN_IF_ERROR(SealReadOnlyForOthers(job->control_fd_.get()));
  job->layout_.Initialize(job->control_.data());
  job->header_ = job->layout_.header(job->control_.data());
  // Version 6 ("Re-formation"): the live world size until one happens.
  job->header_->world_size.store(static_cast<uint32_t>(s.global_world_size()),
                                 std::memory_order_relaxed);
  // A node admitted into a running job starts at the job's epoch and
  // state sync (its ranks attach rejoined and sync first).
  job->header_->epoch.store(s.initial_epoch, std::memory_order_relaxed);
  job->header_->state_behind.store(s.initial_state_behind ? 1 : 0,
                                   std::memory_order_relaxed);
  job->header_->sync_seq.store(s.initial_sync_seq, std::memory_order_relaxed);
  // ... and at the job's iteration: every bucket done, and every rank's
  // row, up to the one before its first (the rows as a rejoined rank's,
  // Job::ResetRestartedRank; its ranks attach rejoined at first_iteration).
  if (s.first_iteration > 1) {
    void* base = job->control_.data();
    const uint64_t before = s.first_iteration - 1;
    std::atomic<uint64_t>* done = job->layout_.done_seq(base);
    for (uint32_t b = 0; b < job->layout_.num_buckets(); ++b) {
      done[b].store(before, std::memory_order_relaxed);
      for (int r = 0; r < world; ++r) {
        job->layout_.ready_row(base, static_cast<uint32_t>(r))[b].store(
            before, std::memory_order_relaxed);
      }
    }
    std::fill(job->started_.begin(), job->started_.end(), before);
    job->reducer_->StartAt(s.first_iteration);
  }
  ASSIGN_OR_RETURN(job->doorbell_,
                   DaemonDoorbell::Create(job->layout_, job->control_.data(),
                                          std::move(bell_fds)));

  job->rank_bytes_ = std::max(kPage, RoundUp(job->bucket_region_bytes_, kPage) +
                                         RoundUp(s.broadcast_bytes, kPage));
  for (int r = 0; r < world; ++r) {
    ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd(
                                      absl::StrCat("gradd-", s.job_id, "-r", r),
                                      job->rank_bytes_));
    ASSIGN_OR_RETURN(Mapping map, Mapping::Map(fd.get(), job->rank_bytes_));
    job->rank_fds_.push_back(std::move(fd));
    job->rank_maps_.push_back(std::move(map));
  }
  for (int r = 0; r < world; ++r) {
    job->bcast_areas_.push_back(static_cast<char*>(job->rank_maps_[r].data()) +
                                job->broadcast_offset());
  }
  RETURN_IF_ERROR(job->AllocateDeviceMemory());
  job->MapBuckets();
  return job;
}

Job::Job(JobSpec spec, std::unique_ptr<BucketReducerInterface> reducer)
    : spec_(std::move(spec)),
      // A slot per parameter: no plan has more buckets than parameters, so
      // a rebuilt plan fits the same block.
      layout_(spec_.local_world_size,
              static_cast<uint32_t>(
                  std::max(spec_.plan.buckets.size(), spec_.params.size()))),
      bucket_region_bytes_(
          std::max(spec_.plan.total_bytes,
                   spec_.params.empty() ? 0 : MaxPlanBytes(spec_.params))),
      reducer_(std::move(reducer)),
      ranks_(spec_.local_world_size),
      restart_inbox_([this] { doorbell_->Ring(); }),
      plan_(spec_.plan),
      started_(spec_.plan.buckets.size(), 0),
      join_(spec_.job_id, spec_.local_world_size, spec_.global_rank_offset,
            spec_.global_world_size(), spec_.num_nodes),
      active_buffers_(spec_.plan.buckets.size()),
      active_ranks_(spec_.plan.buckets.size()),
      hooks_(spec_.job_id, spec_.local_world_size, spec_.comm_hook),
      published_(PublishedState::Layout{spec_.node_rank,
                                        spec_.num_nodes,
                                        spec_.global_world_size(),
                                        spec_.node_ids,
                                        spec_.initial_lost,
                                        {}}),
      timeline_(spec_.timeline_events),
      stalls_(StallOptions(spec_)),
      traces_(spec_.local_world_size, layout_.num_buckets()),
      switch_requests_(spec_.job_id, [this] { doorbell_->Ring(); }),
      reformation_(ReformationOptions(spec_),
                   ReformationDriver::Parts{this, &reducer_, &hand_overs_,
                                            &switch_requests_, &restart_inbox_,
                                            &published_, &events_, EngineNowNs},
                   [this] { doorbell_->Ring(); }) {
  used_map_param_ = FindUsedMapParam(spec_.params);
  events_.Add(&timeline_);
  if (spec_.autotune) {
    AutotuneOptions options = spec_.autotune_options;
    options.fallback_cap_bytes = spec_.planner.bucket_cap_bytes;
    autotune_ = std::make_unique<AutotuneRecord>(std::move(options));
    // Autotune measures the iterations' step times.
    class Steps final : public JobEventSinkInterface {
     public:
      explicit Steps(AutotuneRecord* tune) : tune_(tune) {}
      void OnIteration(const IterationEvent& e) override {
        tune_->OnStep(e.iteration, e.step_ns);
      }

     private:
      AutotuneRecord* const tune_;
    };
    events_.Add(std::make_unique<Steps>(autotune_.get()));
  }
}

Job::~Job() {
  Stop();
  AbortSwitch(absl::OkStatus());
  const absl::Status stopped = absl::CancelledError(absl::StrCat(
      "job '", spec_.job_id, "' stopped before the rank could rejoin"));
  restart_inbox_.Close(stopped);
  // And a re-formation that finished after the job stopped: its reducer
  // never ran anything.
  reformation_.Close(stopped);
  // Joins the reducer's threads (if any) while the memory its completions
  // write to is still mapped.
  reducer_.Replace(nullptr);
}

void Job::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Job::Stop() {
  stop_.store(true, std::memory_order_release);
  if (doorbell_ != nullptr) doorbell_->Ring();
  if (thread_.joinable()) thread_.join();
}

std::vector<int> Job::FdsFor(int rank) const {
  std::vector<int> fds = {control_fd_.get(), rank_fds_[rank].get(),
                          rank_control_fds_[rank].get(),
                          bells_[rank].write_end.get()};
  if (!device_fds_.empty()) fds.push_back(device_fds_[rank].get());
  return fds;
}

void Job::ReleaseFds() {
  // A restarted rank gets the same memory and bell again (FdsFor): keep
  // them. Keeping the bell's write end also keeps the doorbell polling it
  // after the rank's process dies (no POLLHUP while a writer remains).
  if (spec_.rank_restart_grace.count() > 0) return;
  control_fd_.reset();
  rank_fds_.clear();
  rank_control_fds_.clear();
  device_fds_.clear();
  // Without our copy, a rank's exit closes its bell's last write end, which
  // the doorbell sees (POLLHUP) and stops polling.
  for (BellPipe& bell : bells_) bell.write_end.reset();
}

v1::AttachResponse Job::ResponseFor(int rank) const {
  v1::AttachResponse resp;
  AppendBucketSpecs(plan_, resp.mutable_buckets());
  resp.set_rank_memory_bytes(rank_bytes_);
  resp.set_control_block_bytes(layout_.job_bytes());
  resp.set_broadcast_offset(broadcast_offset());
  resp.set_broadcast_bytes(spec_.broadcast_bytes);
  resp.set_global_rank(spec_.global_rank_offset + rank);
  // Global ranks never change, nor does the world size a trainer is told:
  // the job's initial one, which is what its launcher says (WORLD_SIZE,
  // the process group), so a trainer restarted with the same command after
  // a node loss is not refused; the live world size is in the control
  // block (ControlHeader::world_size). Node rank and count are the live
  // layout (a re-formation moves them).
  resp.set_world_size(spec_.initial_global_world_size());
  {
    const PublishedState::Layout live = published_.layout();
    resp.set_node_rank(live.node_rank);
    resp.set_num_nodes(live.num_nodes);
  }
  resp.set_min_nodes(static_cast<uint32_t>(spec_.min_nodes));
  resp.set_epoch(header_->epoch.load(std::memory_order_acquire));
  resp.set_bucket_slots(layout_.num_buckets());
  resp.set_bucket_region_bytes(bucket_region_bytes_);
  // What the rank maps: the allocation as made (rounded up to the device's
  // granularity; cuMem maps whole granules).
  if (!device_memory_.empty()) {
    resp.set_device_memory_bytes(device_memory_[rank]->size());
  }
  // Nothing while the job re-forms: the new reducer describes the devices
  // the same way (the events are the ranks', not the group's).
  reducer_.DescribeDevice(rank, &resp);
  resp.set_rank_restart_grace_ms(
      static_cast<uint32_t>(spec_.rank_restart_grace.count()));
  // A new job; a rejoin overwrites these (Job::RestartRank).
  resp.set_next_iteration(spec_.first_iteration);
  resp.set_collective_seq(0);
  resp.set_sync_seq(header_->sync_seq.load(std::memory_order_acquire));
  return resp;
}

void Job::RankGone(int rank, bool detached) {
  if (ranks_.Gone(rank, detached) == RankStates::kRestarting) {
    header_->restarting.fetch_sub(1, std::memory_order_acq_rel);
  }
  doorbell_->Ring();  // the engine re-checks who is stuck
}

int Job::live_ranks() const { return ranks_.live_count(); }

void Job::Heartbeat() {
  header_->heartbeat_ns.store(MonotonicNs(), std::memory_order_release);
}

void Job::Fail(absl::StatusCode code, absl::string_view message) {
  PublishFailure(code, message);
  doorbell_->Ring();
}

absl::Status Job::status() const { return ReadError(header_); }

uint64_t Job::done_seq(int bucket) const {
  return layout_.done_seq(control_.data())[bucket].load(
      std::memory_order_acquire);
}

std::string Job::RankName(int rank) const {
  return absl::StrCat("local rank ", rank, " of job '", spec_.job_id, "'");
}

void Job::PublishFailure(absl::StatusCode code, absl::string_view message) {
  absl::MutexLock lock(&error_mu_);
  if (header_->status.load(std::memory_order_acquire) == 0) {
    // The first failure is the job's reason; later ones only echo it. The
    // end of a job whose ranks all left is logged by the job manager.
    const bool ended = live_ranks() == 0 && restarting_ranks() == 0;
    spdlog::log(ended ? spdlog::level::debug : spdlog::level::err,
                "job '{}' failed: {}: {}", spec_.job_id,
                absl::StatusCodeToString(code), message);
    if (!ended) events_.OnFailed(code, message);
  }
  PublishError(layout_, control_.data(), code,
               std::string_view(message.data(), message.size()));
}

void Job::EnterPhase(Phase next, absl::string_view why) {
  if (next == phase_ || phase_ == Phase::kFailed) return;
  JobPhaseEvent e;
  e.from = std::string(PhaseName(phase_));
  e.to = std::string(PhaseName(next));
  e.why = std::string(why);
  e.epoch = epoch();
  e.at_ns = EngineNowNs();
  phase_ = next;
  published_.SetPhase(next);
  spdlog::debug("job '{}': {} -> {} ({})", spec_.job_id, e.from, e.to, e.why);
  events_.OnPhase(e);
}

bool Job::FailOnEngine(absl::StatusCode code, absl::string_view message) {
  PublishFailure(code, message);
  EnterPhase(Phase::kFailed, message);
  return false;
}

void Job::Loop() {
  // A single-node job's hand-overs are meetings of the trainers and this
  // thread: it runs at their niceness (server/scheduling.h, issue 21).
  if (spec_.num_nodes <= 1) LowerThreadPriorityTo(kTrainerNiceness);
  while (!stop_.load(std::memory_order_acquire)) {
    // Snapshot the ranks' doorbells before scanning: a publish that lands
    // after the scan moves one past the snapshot, so the wait returns at once.
    doorbell_->Snapshot();
    if (!failed() && header_->status.load(std::memory_order_acquire) != 0) {
      // Failed from outside (a completion's error, the daemon's shutdown):
      // stop reducing.
      EnterPhase(Phase::kFailed, ReadError(header_).message());
    }
    if (failed() && switch_requests_.pending()) {
      AbortSwitch(ReadError(header_));
    }
    if (restart_inbox_.pending()) {
      if (failed()) {
        restart_inbox_.FailAll(ReadError(header_));
      } else if (TryRestartRanks()) {
        continue;
      }
    }
    // Elastic multi-node jobs: while the inter-node group drains or
    // re-forms, nothing new starts (job_reformation.cc).
    const bool held =
        reformation_.enabled() && !failed() && reformation_.Step();
    if (failed() && reformation_.has_returned_ranks()) {
      reformation_.FailReturnedRanks(ReadError(header_));
    }
    bool progress = !failed() && !held && Scan();
    if (!failed() && !held && stalls_.enabled()) CheckStalls();
    if (progress) continue;
    doorbell_->Wait(failed() ? std::chrono::nanoseconds(0) : spec_.spin,
                    kMaxSleep);
  }
}

bool Job::Scan() {
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  const int world = spec_.local_world_size;
  bool progress = false;
  const bool any_gone = !ranks_.all_live();
  if (switch_requests_.pending()) {
    progress |= TrySwitchPlan();
    if (failed()) return false;
  }
  const uint64_t rebuild_after = switch_requests_.rebuild_after();
  const uint64_t aborted_iteration =
      header_->aborted_iteration.load(std::memory_order_acquire);

  if (JoinInPlay()) {
    if (reformation_.epoch().membership_changed()) {
      return FailOnEngine(
          absl::StatusCode::kFailedPrecondition,
          absl::StrCat("job '", spec_.job_id,
                       "': join (uneven inputs) is not supported after a "
                       "node was lost or admitted (epoch ",
                       epoch(), ", world size ", live_world_size(),
                       " of the initial ", spec_.initial_global_world_size(),
                       ")"));
    }
    progress |= StepJoin();
    if (failed()) return false;
    if (join_.active()) {
      progress |= ScanJoinBuckets();
      if (failed()) return false;
      progress |= ScanBroadcast();
      if (any_gone && !failed()) FailGoneInJoin();
      return progress;
    }
  }

  int64_t now = 0;  // read once per scan, when a rank is first seen ready
  // 1 + the CPU of a rank that others wait for (ControlHeader::
  // stand_down_cpu): the first not yet ready in a bucket some rank is.
  uint32_t stand_down = 0;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const uint64_t d = done[b].load(std::memory_order_acquire);
    if (started_[b] > d) continue;  // still with the reducer
    const uint64_t need = d + 1;
    int ready = 0;
    int late = -1;
    for (int r = 0; r < world; ++r) {
      const std::atomic<uint64_t>& row = layout_.ready_row(base, r)[b];
      uint64_t s = row.load(std::memory_order_acquire);
      if (s < d && Lagging(r, row, &s)) continue;
      if (restarts_.BehindIterationAbort(s, d, aborted_iteration)) {
        continue;
      }
      if (s == need && PlanSwitch::SkipsRebuild(rebuild_after, need)) {
        return FailOnEngine(
            absl::StatusCode::kFailedPrecondition,
            absl::StrCat(RankName(r), " started iteration ", need,
                         " without rebuilding buckets, while the job "
                         "rebuilds them after iteration ",
                         rebuild_after,
                         " (every rank must call RebuildBuckets)"));
      }
      if (s == need) {
        ++ready;
        traces_.NoteReady(b, r, need, &now, EngineNowNs);
      } else if (s == d) {
        if (late < 0 && ranks_.live(r)) late = r;
      } else if (ranks_.live(r)) {
        // The protocol allows only "done" (waiting) or "done + 1" (ready).
        return FailOnEngine(
            absl::StatusCode::kFailedPrecondition,
            absl::StrCat(RankName(r), " published bucket ", b,
                         " for iteration ", s, " while iteration ", need,
                         " is in progress (the ready sequence must "
                         "advance by one per iteration)"));
      }
    }
    if (ready < world) {
      if (ready > 0 && late >= 0 && stand_down == 0) {
        stand_down = layout_.rank_header(base, late)
                         ->cpu.load(std::memory_order_relaxed);
      }
      continue;
    }
    // A rank may have entered join mode right after the scan above: the
    // iteration then belongs to the join epoch (StepJoin next time).
    if (JoinInPlay()) break;
    if (!hook_resolved_ && !ResolveCommHook()) return false;
    started_[b] = need;
    progress = true;
    StartBucket(b, need, &bucket_buffers_[b],
                reformation_.epoch().bucket_divisor());
  }
  if (header_->stand_down_cpu.load(std::memory_order_relaxed) != stand_down) {
    header_->stand_down_cpu.store(stand_down, std::memory_order_relaxed);
  }
  if (failed()) return false;
  progress |= ScanBroadcast();
  if (any_gone && !failed()) CheckStuck();
  return progress;
}

void Job::StartBucket(size_t b, uint64_t iteration,
                      const std::vector<void*>* buffers, double divisor,
                      const std::vector<int>* ranks) {
  const Bucket& bucket = plan_.buckets[b];
  BucketWork work;
  work.bucket = static_cast<int>(b);
  work.iteration = iteration;
  work.dtype = bucket.dtype;
  work.count = bucket.size_bytes / DTypeSize(bucket.dtype);
  work.internal = bucket.internal;
  // What the next forward needs first goes first (priority scheduling):
  // the bucket's smallest parameter index (registration order).
  work.priority =
      bucket.params.empty()
          ? 0
          : *std::min_element(bucket.params.begin(), bucket.params.end());
  work.device = bucket.device;
  work.rank_buffers = buffers;
  work.ranks = ranks;
  work.divisor = divisor;
  work.timing = traces_.Started(b, iteration, EngineNowNs());
  // The reduced used map is read before done_seq hands the bucket back.
  const float* used_map = nullptr;
  if (static_cast<int>(b) == used_map_bucket_ && !buffers->empty()) {
    used_map = reinterpret_cast<const float*>(
        static_cast<const char*>((*buffers)[0]) + used_map_offset_);
  }
  hand_overs_.Started();
  reducer_->Start(work, [this, b, iteration, used_map](absl::Status s) {
    if (s.ok() && used_map != nullptr) RecordUsedMap(iteration, used_map);
    Complete(static_cast<int>(b), iteration, std::move(s));
    ReducerWorkDone();
  });
}

void Job::Complete(int bucket, uint64_t iteration, absl::Status status) {
  if (!status.ok()) {
    const std::string what =
        absl::StrCat("job '", spec_.job_id, "' bucket ", bucket, " iteration ",
                     iteration, ": ", status.message());
    // Elastic: the break is the re-formation's, not the job's end.
    if (!NoteInterNodeError(status, what)) PublishFailure(status.code(), what);
    return;
  }
  traces_.Emit(bucket, iteration, EngineNowNs(), &events_);
  layout_.done_seq(control_.data())[bucket].store(iteration,
                                                  std::memory_order_release);
  WakeClients(layout_, control_.data());
}

void Job::CheckStalls() {
  const int64_t now = EngineNowNs();
  if (now < next_stall_check_ns_) return;
  next_stall_check_ns_ = now + kStallCheckNs;
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  const int world = spec_.local_world_size;
  const int64_t threshold = stalls_.threshold_ns();
  std::vector<BucketWait> waits;
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const uint64_t d = done[b].load(std::memory_order_acquire);
    if (started_[b] > d) {
      // With the reducer: only the multi-node one can wait (the fused one
      // completes inside Start), on the other nodes.
      if (spec_.num_nodes <= 1) continue;
      const int64_t since = traces_.started_ns(b);
      if (since == 0 || now - since < threshold) continue;
      BucketWait w;
      w.iteration = started_[b];
      w.bucket = static_cast<int>(b);
      w.since_ns = since;
      w.in_network = true;
      waits.push_back(std::move(w));
      continue;
    }
    // In a join epoch the ranks that joined hand nothing over by design
    // (and the join scan does not note hand-overs).
    if (join_.active() || traces_.first_ready_iteration(b) != d + 1 ||
        now - traces_.first_ready_ns(b) < threshold) {
      continue;
    }
    BucketWait w;
    w.iteration = d + 1;
    w.bucket = static_cast<int>(b);
    w.since_ns = traces_.first_ready_ns(b);
    for (int r = 0; r < world; ++r) {
      if (layout_.ready_row(base, r)[b].load(std::memory_order_acquire) !=
          d + 1) {
        w.missing_local_ranks.push_back(r);
      }
    }
    if (w.missing_local_ranks.empty()) continue;  // starts on the next scan
    waits.push_back(std::move(w));
  }
  // A bucket queued for the network behind one this node's ranks have not
  // handed over waits for them, not for the other nodes.
  std::optional<std::pair<uint64_t, int>> first_local;
  for (const BucketWait& w : waits) {
    const std::pair<uint64_t, int> key(w.iteration, w.bucket);
    if (!w.in_network && (!first_local || key < *first_local)) {
      first_local = key;
    }
  }
  if (first_local.has_value()) {
    waits.erase(std::remove_if(waits.begin(), waits.end(),
                               [&](const BucketWait& w) {
                                 return w.in_network &&
                                        std::make_pair(w.iteration, w.bucket) >
                                            *first_local;
                               }),
                waits.end());
  }
  std::optional<std::string> fail = stalls_.Update(
      now, std::move(waits),
      [this](int b) {
        std::vector<std::string> names;
        for (int32_t p : plan_.buckets[b].params) {
          names.push_back(spec_.params[p].name);
        }
        return names;
      },
      &events_);
  // While a rank restarts, its grace (the JobManager's) bounds the wait,
  // not the stall shutdown; the warnings still go out.
  if (fail.has_value() && restarting_ranks() == 0) {
    FailOnEngine(absl::StatusCode::kDeadlineExceeded, *fail);
  }
}

bool Job::ResolveCommHook() {
  hook_resolved_ = true;
  auto fail = [&](const absl::Status& s) {
    return FailOnEngine(
        s.code(), absl::StrCat("job '", spec_.job_id, "': ", s.message()));
  };
  absl::StatusOr<v1::CommHookSpec> spec = hooks_.Resolve();
  if (!spec.ok()) return fail(spec.status());
  if (absl::Status s = reducer_->AgreeCommHook(DescribeCommHook(*spec));
      !s.ok()) {
    return fail(s);
  }
  hook_spec_ = *std::move(spec);
  if (absl::Status s = InstallCommHook(); !s.ok()) return fail(s);
  return true;
}

absl::Status Job::InstallCommHook() {
  // Built over the live plan: a bucket rebuild (job_rebuild.cc) installs a
  // fresh hook for the new buckets, as torch's per-bucket hook state starts
  // over with its rebuilt buckets.
  CommHookContext context;
  context.world_size = spec_.divide_by_initial_world_size
                           ? spec_.initial_global_world_size()
                           : live_world_size();
  context.params = &spec_.params;
  context.plan = &plan_;
  context.pool = spec_.hook_pool;
  ASSIGN_OR_RETURN(std::unique_ptr<CommHookInterface> hook,
                   MakeCommHook(hook_spec_, context));
  return reducer_->SetCommHook(std::move(hook));
}

void Job::CheckStuck() {
  // A gone rank only matters when a live rank waits for something the gone
  // rank will now never publish; ranks that finished the same iteration and
  // leave one after the other get no error.
  void* base = control_.data();
  std::atomic<uint64_t>* done = layout_.done_seq(base);
  const int world = spec_.local_world_size;
  auto report = [&](int gone, absl::string_view what) {
    const bool detached = ranks_.state(gone) == RankStates::kDetached;
    FailOnEngine(
        absl::StatusCode::kAborted,
        absl::StrCat(RankName(gone), detached ? " detached" : " disconnected",
                     " during ", what,
                     "; the job cannot continue on this node"));
  };
  for (size_t b = 0; b < plan_.buckets.size(); ++b) {
    const uint64_t d = done[b].load(std::memory_order_acquire);
    if (started_[b] > d) continue;
    bool waiting = false;
    int missing = -1;
    for (int r = 0; r < world; ++r) {
      const bool ready = layout_.ready_row(base, r)[b].load(
                             std::memory_order_acquire) == d + 1;
      const RankStates::State state = ranks_.state(r);
      if (state == RankStates::kLive) {
        waiting |= ready;
      } else if (!ready && missing < 0 && state != RankStates::kRestarting) {
        missing = r;  // a restarting rank is waited for (job_restart.cc)
      }
    }
    if (waiting && missing >= 0) {
      report(missing, absl::StrCat("iteration ", d + 1));
      return;
    }
  }
  const uint64_t bd = header_->bcast_done_seq.load(std::memory_order_acquire);
  if (bcast_started_ > bd) return;  // with the reducer: it reports failures
  bool waiting = false;
  int missing = -1;
  for (int r = 0; r < world; ++r) {
    const bool ready = layout_.bcast(base, r)->ready_seq.load(
                           std::memory_order_acquire) == bd + 1;
    const RankStates::State state = ranks_.state(r);
    if (state == RankStates::kLive) {
      waiting |= ready;
    } else if (!ready && missing < 0 && state != RankStates::kRestarting) {
      missing = r;
    }
  }
  if (waiting && missing >= 0) {
    report(missing, absl::StrCat("broadcast ", bd + 1));
  }
}

}  // namespace gradd
