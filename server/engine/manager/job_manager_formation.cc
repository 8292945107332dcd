// JobManager's hand-off from a pending job to an active one
// (job_manager.h): for a multi-node job, the formation thread (rendezvous,
// the other nodes, NCCL between them; formation/) and its result, posted
// back to the control thread; then, for every job, its reducer, the Job,
// every rank's fds and the Attach replies. Control thread; the formation
// thread's body is FormNodes (form_nodes.h).
#include <algorithm>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/engine/manager/attach_validation.h"
#include "server/engine/manager/form_nodes.h"
#include "server/engine/manager/job_manager.h"
#include "server/engine/reduce/device_reducer.h"
#include "server/logging.h"
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
  FormNodesRequest form;
  form.options = std::move(options);
  form.coordinator = request.coordinator();
  form.selector = coordinators_;
  form.advertise_host = rv.advertise_host();
  form.interface = rv.interface();
  form.min_nodes = spec.min_nodes;
  form.rank_devices = spec.rank_devices;
  form.nccl = nccl;
  form.settle = absl::Milliseconds(rv.reformation_settle_ms());
  form.limit = limit - kFormationMargin;
  std::thread([mailbox = mailbox_, form = std::move(form),
               spec = std::move(spec), job_id, formation]() mutable {
    absl::StatusOr<FormedNodes> result = FormNodes(std::move(form));
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
    std::vector<JobNode> members, std::optional<NodeAdmission> admission,
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
    info.bucket_cap_bytes = (*job)->spec().planner.bucket_cap_bytes;
    info.autotune = (*job)->autotune() != nullptr;
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
