// JobManager's hand-off from a pending job to an active one
// (job_manager.h): for a multi-node job, the formation thread (rendezvous,
// the other nodes, NCCL between them; formation/) and its result, posted
// back to the control thread; then, for every job, its reducer, the Job,
// every rank's fds and the Attach replies. Control thread, except the body
// of the formation thread.
#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "server/engine/manager/attach_validation.h"
#include "server/engine/manager/job_manager.h"
#include "server/engine/reduce/device_reducer.h"
#include "server/engine/reduce/hierarchical_reducer.h"
#include "server/logging.h"
#include "server/rendezvous/host_addresses.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {
namespace {

// A formation gives up this much before the earliest Attach deadline of its
// ranks, so they read the rendezvous' reason rather than a bare timeout.
constexpr absl::Duration kFormationMargin = absl::Milliseconds(500);

}  // namespace

void JobManager::StartNodeFormation(const std::string& job_id, JobSpec spec) {
  PendingJob& p = pending_.at(job_id);
  const v1::AttachRequest& request = p.rank(0)->request;
  const v1::RendezvousConfig& rv = config_.rendezvous();
  absl::Time limit = absl::InfiniteFuture();
  for (const auto& r : p.ranks()) limit = std::min(limit, r->deadline);

  NodeFormationOptions options;
  options.job_id = job_id;
  options.node_id =
      request.node_id().empty() ? config_.node_id() : request.node_id();
  if (request.has_node_rank()) options.node_rank = request.node_rank();
  options.num_nodes = request.num_nodes();
  options.local_world_size = p.world();
  options.params = spec.params;
  options.local_plan = spec.plan;
  options.formation_timeout =
      std::min(absl::Milliseconds(rv.formation_timeout_ms()),
               limit - absl::Now() - kFormationMargin);
  // A peer node waits in the network while a rank of another node restarts.
  options.collective_timeout = InterNodeCollectiveTimeout(
      static_cast<uint32_t>(spec.rank_restart_grace.count()));
  options.elastic = IsReformableAcrossNodes(
      options.num_nodes, spec.min_nodes,
      static_cast<uint32_t>(spec.rank_restart_grace.count()));
  for (absl::string_view id :
       absl::StrSplit(rv.expected_node_ids(), ',', absl::SkipWhitespace())) {
    options.expected_node_ids.emplace_back(absl::StripAsciiWhitespace(id));
  }
  if (options.formation_timeout <= absl::ZeroDuration()) {
    FailPending(job_id, absl::DeadlineExceededError(absl::StrCat(
                            "job '", job_id,
                            "': no time left before the Attach deadline to "
                            "rendezvous with the other nodes")));
    return;
  }
  const uint64_t formation = next_formation_++;
  p.StartForming(formation);
  NcclJobPlatformInterface* nccl = UsesDeviceReducer(spec.params, spec.devices)
                                       ? DaemonNcclJobPlatform()
                                       : nullptr;
  // The rendezvous blocks (up to the formation timeout) and so may finding the
  // coordinator (name resolution); both run on a thread of their own and
  // post back through the mailbox, which outlives this object, as does the
  // shared coordinator selector.
  // An elastic job may be running without this node (it was lost, or is
  // new): the formation thread looks for it first and asks to be admitted.
  const bool elastic = options.elastic;
  std::thread([mailbox = mailbox_, options = std::move(options),
               requested = request.coordinator(), selector = coordinators_,
               advertise = rv.advertise_host(), ifname = rv.interface(),
               spec = std::move(spec), job_id, formation, nccl, elastic,
               settle = absl::Milliseconds(rv.reformation_settle_ms()),
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
      spdlog::info(
          "{}",
          absl::StrCat("job '", job_id, "': node '", options.node_id,
                       "' joining ", options.num_nodes, " nodes through ",
                       coordinator, " (Gloo on ", options.advertise_host, ")"));
      ASSIGN_OR_RETURN(
          std::unique_ptr<RendezvousStoreInterface> client,
          selector->Connect(coordinator, options.formation_timeout));
      if (elastic && spec.min_nodes > 0) {
        absl::StatusOr<std::string> running =
            FindRunning(*client, job_id,
                        std::min(options.formation_timeout, absl::Seconds(5)));
        if (running.ok()) {
          ReformOptions admit;
          admit.job_id = job_id;
          admit.node_id = options.node_id;
          admit.reformation_prefix = *running;
          admit.epoch = 0;  // the next one the running nodes open
          admit.local_world_size = options.local_world_size;
          admit.max_nodes = options.num_nodes;
          admit.min_nodes = spec.min_nodes;
          admit.params = options.params;
          // The agreement knows returning ids (ElasticMembers.departed).
          admit.requested_offset = -1;
          admit.advertise_host = options.advertise_host;
          admit.settle = settle;
          admit.timeout = options.formation_timeout;
          admit.collective_timeout = options.collective_timeout;
          admit.reason =
              absl::StrCat("node '", options.node_id, "' asks to be admitted");
          spdlog::info(
              "{}", absl::StrCat("job '", job_id, "' runs already (", *running,
                                 "): node '", options.node_id,
                                 "' asks to be admitted"));
          ASSIGN_OR_RETURN(admit.arrival, AnnounceArrival(*client, admit));
          ASSIGN_OR_RETURN(Reformed reformed, ReformNodeJob(*client, admit));
          if (!reformed.plan.has_value()) {
            return absl::InternalError(absl::StrCat(
                "job '", job_id,
                "': admitted into the running job but its plan did not come "
                "with the agreement"));
          }
          FormedNodes out;
          if (nccl != nullptr) {
            // The running nodes connect a fresh communicator of the new
            // group too (JobManager::StartReformation).
            ASSIGN_OR_RETURN(
                out.nccl,
                SetUpNcclForGroup(*client, *nccl, job_id, reformed.store_prefix,
                                  reformed.layout, options.collective_timeout,
                                  spec.rank_devices, limit));
          }
          out.formation.layout = std::move(reformed.layout);
          out.formation.plan = *std::move(reformed.plan);
          out.formation.backend = std::move(reformed.backend);
          Admission a;
          a.epoch = reformed.epoch;
          a.sync_seq = reformed.sync_seq;
          a.behind = reformed.behind;
          a.store_prefix = reformed.store_prefix;
          a.reformation_prefix = *running;
          a.arrivals_seen = reformed.arrivals_seen;
          a.max_nodes = options.num_nodes;
          a.initial_world_size = reformed.initial_world_size;
          a.lost = reformed.departed;
          // The running nodes abort max_completed + 1 and go on at the
          // next one (Job::AbortInProgress); a job without buckets counts
          // no iterations.
          a.first_iteration = out.formation.plan.buckets.empty()
                                  ? 1
                                  : reformed.max_completed + 2;
          out.admission = std::move(a);
          out.coordinator = coordinator;
          // "elastic<k>" belongs to formation round "round<k>" (rebuilds
          // agree under it).
          out.round_prefix =
              absl::StrCat("round", absl::StripPrefix(*running, "elastic"));
          for (const std::string& round : {out.round_prefix, *running}) {
            absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> holder =
                selector->Connect(coordinator, options.formation_timeout);
            if (!holder.ok()) continue;
            (*holder)->ReleaseRoundWhenDone(job_id, round, options.node_id,
                                            options.num_nodes);
            out.releases.push_back(*std::move(holder));
          }
          out.store = std::move(client);
          return out;
        }
        if (!absl::IsNotFound(running.status())) return running.status();
      }
      ASSIGN_OR_RETURN(options.prefix, OpenRound(*client, job_id));
      absl::StatusOr<NodeFormation> formed = FormNodeJob(*client, options);
      if (formed.ok() && elastic) {
        // Arrivals find the job through it (every node writes the same).
        if (absl::Status marked =
                MarkRunning(*client, job_id, ReformationPrefix(options.prefix),
                            options.prefix, options.node_id);
            !marked.ok()) {
          formed = marked;
        }
      }
      FormedNodes out;
      if (formed.ok() && nccl != nullptr) {
        absl::StatusOr<std::shared_ptr<NcclJobSetup>> set_up =
            SetUpNcclForGroup(*client, *nccl, job_id, options.prefix,
                              formed->layout, options.collective_timeout,
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
      if (elastic) {
        // The reducer's client goes at the first re-formation; the round
        // and the elastic namespace are held by clients of their own.
        for (const std::string& round :
             {options.prefix, ReformationPrefix(options.prefix)}) {
          absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> holder =
              selector->Connect(coordinator, options.formation_timeout);
          if (!holder.ok()) continue;  // the job TTL removes the keys
          (*holder)->ReleaseRoundWhenDone(job_id, round, options.node_id,
                                          out.formation.layout.num_nodes);
          out.releases.push_back(*std::move(holder));
        }
      } else {
        client->ReleaseRoundWhenDone(job_id, options.prefix, options.node_id,
                                     out.formation.layout.num_nodes);
      }
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
  if (it == pending_.end() || it->second.formation() != formation) {
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
  if (result->admission.has_value()) {
    spec.reformation_prefix = result->admission->reformation_prefix;
    spec.initial_epoch = result->admission->epoch;
    spec.initial_sync_seq = result->admission->sync_seq;
    spec.initial_state_behind = result->admission->behind;
    // Its world_size is the live one; divide_by_initial_world_size, the
    // snapshot and its own re-formations use the job's initial one.
    spec.initial_world_size = result->admission->initial_world_size;
    spec.initial_lost = result->admission->lost;
    spec.first_iteration = result->admission->first_iteration;
  } else {
    spec.reformation_prefix = ReformationPrefix(result->round_prefix);
  }
  const bool elastic = IsReformableAcrossNodes(
      spec.num_nodes, spec.min_nodes,
      static_cast<uint32_t>(spec.rank_restart_grace.count()));
  if (!elastic) spec.reformation_prefix.clear();
  spdlog::info(
      "{}", absl::StrCat("job '", job_id, "' formed: node rank ",
                         layout.node_rank, " of ", layout.num_nodes, " (",
                         absl::StrJoin(layout.NodeIds(), ", "),
                         "), global ranks ", layout.global_rank_offset, "..",
                         layout.global_rank_offset + spec.local_world_size - 1,
                         " of ", layout.world_size, ", ",
                         spec.plan.buckets.size(), " buckets"));
  std::unique_ptr<BucketReducerInterface> reducer = MakeNodeReducer(
      spec, layout,
      result->admission.has_value() ? result->admission->store_prefix
                                    : result->round_prefix,
      std::move(result->formation.backend), std::move(result->store));
  Activate(job_id, std::move(spec), std::move(reducer), layout.nodes,
           std::move(result->admission), std::move(result->releases));
}

void JobManager::Activate(
    const std::string& job_id, JobSpec spec,
    absl::StatusOr<std::unique_ptr<BucketReducerInterface>> reducer,
    std::vector<JobNode> members, std::optional<Admission> admission,
    std::vector<std::unique_ptr<RendezvousStoreInterface>> releases) {
  PendingJob& p = pending_.at(job_id);
  if (reducer.ok()) {
    reducer = WrapDeviceReducer(spec.device_spec(), *std::move(reducer));
  }
  // The device reducer holds the NCCL communicators from here on, so that
  // replacing it (a re-formation) frees them; the spec keeps no copy.
  spec.nccl_between_nodes.reset();
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
  std::vector<uint64_t> attach_ids(p.world());
  for (int r = 0; r < p.world(); ++r) {
    attach_ids[r] = next_attach_id_++;
    absl::Status sent = sessions_->SendFds(p.rank(r)->request.session_id(),
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
    info.world_size = (*job)->spec().global_world_size();
    if (info.num_nodes > 1) info.node_ids = (*job)->spec().node_ids;
    info.lost_node_ids = (*job)->spec().initial_lost;
    info.epoch = (*job)->spec().initial_epoch;
    (*job)->AddEventSink(events_->OnJobStarted(info));
  }
  ActiveJob active;
  active.generation = next_generation_++;
  active.job = *std::move(job);
  {
    // Node loss and arrival: the reform handler must be set before Start.
    const JobSpec& s = active.job->spec();
    if (IsReformableAcrossNodes(
            s.num_nodes, s.min_nodes,
            static_cast<uint32_t>(s.rank_restart_grace.count()))) {
      MakeReformable(active, members, s.node_rank,
                     admission ? admission->max_nodes : s.num_nodes,
                     admission ? admission->arrivals_seen : 0,
                     admission ? admission->epoch : 0, std::move(releases));
    }
  }
  active.job->Start();
  {
    const Job& j = *active.job;
    size_t bytes = 0;
    for (const Bucket& b : j.plan().buckets) bytes += b.size_bytes;
    spdlog::info(
        "job '{}' {}: {} local ranks, node {} of {}, world size {}, {} "
        "parameters in {} buckets ({} bytes per rank)",
        job_id,
        admission ? absl::StrCat("admitted into its running job at epoch ",
                                 admission->epoch)
                  : std::string("formed"),
        j.local_world_size(), j.spec().node_rank, j.spec().num_nodes,
        j.spec().global_world_size(), j.spec().params.size(),
        j.plan().buckets.size(), bytes);
  }

  const int world = p.world();
  std::vector<PendingRank> ready = p.TakeAll();  // complete: every rank
  pending_.erase(job_id);
  active.rebuild =
      MakeRebuildCoordinator(active.job.get(), config_, coordinators_);
  // Each rank's session was bound by its Attach (bindings_).
  active.restarts = RankRestartDeadlines(
      job_id, world, absl::FromChrono(active.job->spec().rank_restart_grace));
  const Job& formed = *active.job;
  std::vector<v1::AttachResponse> responses;
  for (int r = 0; r < world; ++r) {
    responses.push_back(formed.ResponseFor(r));
    responses.back().set_attach_id(attach_ids[r]);
    // A node admitted into its running job: its ranks take part in the
    // next state sync before their first iteration.
    if (admission.has_value()) responses.back().set_restarted(true);
  }
  jobs_.emplace(job_id, std::move(active));
  for (int r = 0; r < world; ++r) {
    std::move(ready[r].done)(std::move(responses[r]));
  }
}

}  // namespace gradd
