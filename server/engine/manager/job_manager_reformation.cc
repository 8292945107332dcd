// JobManager's side of node loss and arrival (job_manager.h "Elastic
// multi-node jobs"): the reform handler and its re-formation thread, the
// new reducer handed to the Job, and the watcher that breaks a job's group
// for a node asking to be admitted. Control thread, except the bodies of
// the re-formation and watcher threads, which only post back through the
// mailbox.
#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/manager/arrival_watcher.h"
#include "server/engine/manager/attach_validation.h"
#include "server/engine/manager/job_manager.h"
#include "server/engine/reduce/device_reducer.h"
#include "server/engine/reduce/hierarchical_reducer.h"
#include "server/logging.h"
#include "server/rendezvous/host_addresses.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {
namespace {

std::string NodeList(const std::vector<std::string>& ids) {
  return absl::StrCat("(", absl::StrJoin(ids, ", "), ")");
}

}  // namespace

absl::Duration JobManager::InterNodeCollectiveTimeout(uint32_t grace_ms) const {
  return absl::Milliseconds(config_.rendezvous().collective_timeout_ms()) +
         absl::Milliseconds(grace_ms);
}

std::unique_ptr<BucketReducerInterface> JobManager::MakeNodeReducer(
    const JobSpec& spec, const JobLayout& layout,
    const std::string& store_prefix,
    std::unique_ptr<CollectiveBackendInterface> backend,
    std::unique_ptr<RendezvousStoreInterface> store) {
  HierarchicalReducer::Options options;
  options.pool = pool_;
  options.num_buckets = static_cast<int>(spec.plan.buckets.size());
  for (const JobNode& node : layout.nodes) {
    options.node_offsets.push_back(node.global_rank_offset);
  }
  // The live world size even for divide_by_initial_world_size: the Job
  // passes that divisor per bucket.
  options.world_size = layout.world_size;
  // Checked equal on every node before the first bucket (AgreeCommHook).
  options.scheduling =
      config_.scheduling() == "none"
          ? HierarchicalReducer::Options::Scheduling::kPlanOrder
          : HierarchicalReducer::Options::Scheduling::kPriority;
  options.chunk_bytes = static_cast<size_t>(config_.partition_mb() * (1 << 20));
  options.job_id = spec.job_id;
  options.store_prefix = store_prefix;
  options.agree_timeout = InterNodeCollectiveTimeout(
      static_cast<uint32_t>(spec.rank_restart_grace.count()));
  return std::make_unique<HierarchicalReducer>(
      std::move(options), std::move(backend), std::move(store));
}

void JobManager::MakeReformable(
    ActiveJob& active, const std::vector<JobNode>& members, int node_rank,
    int max_nodes, int64_t arrivals_seen, uint64_t epoch,
    std::vector<std::unique_ptr<RendezvousStoreInterface>> releases) {
  auto state = std::make_unique<Reformable>(
      NodeEpochs(members, node_rank, max_nodes, arrivals_seen, epoch));
  state->releases = std::move(releases);
  const NodeEpochs::Watch watch = state->epochs.watch();
  const std::string job_id = active.job->id();
  const uint64_t generation = active.generation;
  // Engine thread, once drained: hand the break to the control thread.
  active.job->SetReformationHandler(
      [mailbox = mailbox_, job_id, generation](Job::ReformationRequest broke) {
        absl::MutexLock lock(&mailbox->mu);
        if (mailbox->owner == nullptr) return;  // daemon stopping
        mailbox->owner->Post([owner = mailbox->owner, job_id, generation,
                              broke = std::move(broke)]() mutable {
          owner->StartReformation(job_id, generation, std::move(broke));
        });
      });

  // The watcher (arrival_watcher.h): nodes asking to be admitted, and this
  // node's liveness in the job. It stops once the job's ActiveJob is gone.
  const JobSpec& spec = active.job->spec();
  ArrivalWatch w;
  w.selector = coordinators_;
  w.job_id = job_id;
  w.coordinator = spec.coordinator;
  w.reformation_prefix = spec.reformation_prefix;
  w.node_id = members.at(node_rank).node_id;
  w.stopped = state->watcher.stopped;
  w.watch = watch;
  std::thread([mailbox = mailbox_, w = std::move(w), generation]() {
    WatchArrivals(w, [&](int64_t n) {
      absl::MutexLock lock(&mailbox->mu);
      if (mailbox->owner == nullptr) return false;
      mailbox->owner->Post([owner = mailbox->owner, job_id = w.job_id,
                            generation,
                            n] { owner->ArrivalSeen(job_id, generation, n); });
      return true;
    });
  }).detach();
  active.reformable = std::move(state);
}

void JobManager::ArrivalSeen(const std::string& job_id, uint64_t generation,
                             int64_t n) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.generation != generation) return;
  // Seen during a re-formation: that one admits it (or refuses it), or,
  // when it came too late for it, the watcher posts it again once the
  // re-formation is over (it counts them). Breaking now would re-form once
  // more for nothing: the Job keeps a request made while it re-forms for
  // the next break. Settled by a re-formation since: nothing to do.
  if (const Reformable* reformable = it->second.reformable.get();
      reformable != nullptr && !reformable->epochs.BreaksFor(n)) {
    return;
  }
  spdlog::info(
      "job '{}': a node asks to be admitted (arrival {}); breaking "
      "the job's group at the next iteration boundary",
      job_id, n);
  it->second.job->RequestReformation("node asks to be admitted");
}

void JobManager::StartReformation(const std::string& job_id,
                                  uint64_t generation,
                                  Job::ReformationRequest broke) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.generation != generation ||
      it->second.reformable == nullptr) {
    return;  // the job ended meanwhile
  }
  ActiveJob& active = it->second;
  NodeEpochs& epochs = active.reformable->epochs;
  const JobSpec& spec = active.job->spec();
  const v1::RendezvousConfig& rv = config_.rendezvous();
  epochs.Begin();

  ReformOptions options;
  options.job_id = job_id;
  options.node_id = epochs.self().node_id;
  options.reformation_prefix = spec.reformation_prefix;
  options.epoch = broke.epoch + 1;
  options.previous = epochs.members();
  options.local_world_size = spec.local_world_size;
  options.max_nodes = epochs.max_nodes();
  options.min_nodes = epochs.min_nodes(spec.min_nodes);
  options.completed_iteration = broke.completed_iteration;
  options.sync_seq = broke.sync_seq;
  options.params = spec.params;
  options.plan = active.job->plan();
  options.requested_offset = epochs.self().global_rank_offset;
  // Published by the closer for the arrivals; a node that was admitted
  // itself passes on what it learned then (JobSpec::initial_world_size).
  options.initial_world_size = spec.initial_global_world_size();
  options.settle = absl::Milliseconds(rv.reformation_settle_ms());
  options.silence = absl::Milliseconds(rv.reformation_silence_ms());
  options.timeout = absl::Milliseconds(rv.formation_timeout_ms());
  options.collective_timeout = InterNodeCollectiveTimeout(
      static_cast<uint32_t>(spec.rank_restart_grace.count()));
  options.reason = broke.reason;
  options.restarted_local_ranks = broke.restarted_local_ranks;
  // What it was is known once the epoch closes: the job's "re-formed" line
  // says it, the same on every node (job_reformation.cc).
  spdlog::debug(
      "job '{}': re-forming after epoch {} with the nodes that are there "
      "(at least {}, settling {} ms)",
      job_id, broke.epoch, options.min_nodes, rv.reformation_settle_ms());

  // A CUDA job connects a fresh NCCL communicator among the new group
  // (nccl_job_setup.h says why not ncclCommShrink); every node of the
  // epoch, the arrivals included (job_manager_formation.cc), does.
  NcclJobPlatformInterface* nccl = UsesDeviceReducer(spec.params, spec.devices)
                                       ? DaemonNcclJobPlatform()
                                       : nullptr;
  std::thread([mailbox = mailbox_, selector = coordinators_,
               coordinator = spec.coordinator, advertise = rv.advertise_host(),
               ifname = rv.interface(), options = std::move(options), job_id,
               generation, nccl, rank_devices = spec.rank_devices]() mutable {
    std::unique_ptr<RendezvousStoreInterface> client;
    absl::StatusOr<Reformed> result = [&]() -> absl::StatusOr<Reformed> {
      absl::StatusOr<std::string> advertised =
          AdvertiseAddress(advertise, ifname, coordinator);
      if (!advertised.ok()) {
        return absl::Status(
            advertised.status().code(),
            absl::StrCat("job '", job_id,
                         "': choosing the address the other nodes reach this "
                         "one on: ",
                         advertised.status().message()));
      }
      options.advertise_host = *std::move(advertised);
      ASSIGN_OR_RETURN(client, selector->Connect(coordinator, options.timeout));
      ASSIGN_OR_RETURN(Reformed reformed, ReformNodeJob(*client, options));
      if (nccl != nullptr) {
        // Its own budget: the agreement may have used most of the timeout.
        const absl::Time limit = absl::Now() + options.timeout;
        ASSIGN_OR_RETURN(
            reformed.nccl,
            SetUpNcclForGroup(*client, *nccl, job_id, reformed.store_prefix,
                              reformed.layout, options.collective_timeout,
                              rank_devices, limit));
      }
      return reformed;
    }();
    absl::MutexLock lock(&mailbox->mu);
    if (mailbox->owner == nullptr) return;
    mailbox->owner->Post([owner = mailbox->owner, job_id, generation,
                          reason = options.reason, result = std::move(result),
                          client = std::move(client)]() mutable {
      owner->FinishReformation(job_id, generation, std::move(reason),
                               std::move(result), std::move(client));
    });
  }).detach();
}

void JobManager::FinishReformation(
    const std::string& job_id, uint64_t generation, std::string reason,
    absl::StatusOr<Reformed> result,
    std::unique_ptr<RendezvousStoreInterface> store) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.generation != generation ||
      it->second.reformable == nullptr) {
    return;  // the job ended meanwhile; dropping the backend tells peers
  }
  ActiveJob& active = it->second;
  NodeEpochs& epochs = active.reformable->epochs;
  Job& job = *active.job;
  epochs.End();
  if (!result.ok()) {
    const absl::Status failed(
        result.status().code(),
        absl::StrCat("job '", job_id, "': re-forming the nodes' group after '",
                     reason, "' failed: ", result.status().message()));
    spdlog::error("{}", failed.message());
    job.Reformed(failed);
    return;
  }
  Reformed& r = *result;
  const JobLayout& layout = r.layout;
  const std::vector<std::string> ids = layout.NodeIds();
  // The job's "re-formed" line says what happened, once, on every node
  // (job_reformation.cc); this one is for debugging the agreement.
  spdlog::debug(
      "job '{}': epoch {} agreed: node rank {} of {} of at most {} {}, world "
      "size {}, max completed iteration {}{}",
      job_id, r.epoch, layout.node_rank, layout.num_nodes, epochs.max_nodes(),
      NodeList(ids), layout.world_size, r.max_completed,
      r.behind ? " (this node was one iteration behind)" : "");

  Job::ReformationResult net;
  net.epoch = r.epoch;
  net.node_rank = layout.node_rank;
  net.num_nodes = layout.num_nodes;
  net.world_size = layout.world_size;
  net.node_ids = ids;
  net.store_prefix = r.store_prefix;
  net.sync_seq = r.sync_seq;
  net.behind = r.behind;
  net.lost = r.lost;
  net.admitted = r.admitted;
  net.cause = r.cause;
  net.reason = r.reason;
  net.departed = r.departed;
  std::unique_ptr<BucketReducerInterface> reducer =
      MakeNodeReducer(job.spec(), layout, r.store_prefix, std::move(r.backend),
                      std::move(store));
  // A CUDA job's buckets go over the new group's NCCL communicator (null:
  // staged through host memory, as its setup says why).
  DeviceJobSpec device = job.spec().device_spec();
  device.node_rank = layout.node_rank;
  device.num_nodes = layout.num_nodes;
  device.world_size = layout.world_size;
  device.nccl_between_nodes = std::move(r.nccl);
  absl::StatusOr<std::unique_ptr<BucketReducerInterface>> wrapped =
      WrapDeviceReducer(device, std::move(reducer));
  if (!wrapped.ok()) {
    job.Reformed(absl::Status(
        wrapped.status().code(),
        absl::StrCat("job '", job_id,
                     "': after re-forming: ", wrapped.status().message())));
    return;
  }
  // A group that breaks again and again before any iteration completes
  // fails the job instead of re-forming forever (reformation_stall.h).
  if (absl::Status adopted = epochs.Adopt(
          job_id, layout, r.epoch, r.max_completed, r.arrivals_seen, r.reason);
      !adopted.ok()) {
    job.Reformed(std::move(adopted));
    return;
  }
  net.reducer = *std::move(wrapped);
  job.Reformed(std::move(net));
}

}  // namespace gradd
