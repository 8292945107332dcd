#include "server/engine/formation/reformation.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gradd/v1/rendezvous.pb.h"
#include "server/backends/gloo/gloo_backend.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/formation/node_formation.h"
#include "server/engine/formation/reformation_agreement.h"
#include "server/engine/formation/reformation_keys.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

using reformation_internal::AgreeByTransaction;
using reformation_internal::AliveKey;
using reformation_internal::ArrivalKey;
using reformation_internal::ArrivalsKey;
using reformation_internal::AwaitVerdict;
using reformation_internal::CloseEpoch;
using reformation_internal::EpochKeys;
using reformation_internal::IsSurvivor;
using reformation_internal::kClosedBias;
using reformation_internal::KeysOf;
using reformation_internal::kProbe;
using reformation_internal::LastClosedEpoch;
using reformation_internal::Left;
using reformation_internal::Prefixed;
using reformation_internal::Probe;
using reformation_internal::RunningKey;
using reformation_internal::StillRunning;
using reformation_internal::StoredVerdict;
using reformation_internal::Where;

// Every step after the agreement gets at least this long (the others are
// just as late, as in FormNodeJob).
constexpr absl::Duration kMinStep = absl::Seconds(2);

v1::ElasticMember MemberOf(const ReformOptions& o) {
  v1::ElasticMember m;
  m.set_node_id(o.node_id);
  m.set_local_world_size(o.local_world_size);
  m.set_completed_iteration(o.completed_iteration);
  m.set_sync_seq(o.sync_seq);
  m.set_requested_offset(o.requested_offset);
  for (v1::ParamSpec& p : Fingerprint(o.params)) *m.add_params() = std::move(p);
  m.set_reason(o.reason);
  m.set_initial_world_size(o.initial_world_size);
  for (int r : o.restarted_local_ranks) m.add_restarted_local_ranks(r);
  return m;
}

// The last epoch closed (0: none yet).

ReformCause CauseOf(v1::ReformCause cause) {
  switch (cause) {
    case v1::REFORM_CAUSE_NODE_LOST:
      return ReformCause::kNodeLost;
    case v1::REFORM_CAUSE_NODE_ADMITTED:
      return ReformCause::kNodeAdmitted;
    case v1::REFORM_CAUSE_RANK_REJOINED:
      return ReformCause::kRankRestarted;
    case v1::REFORM_CAUSE_OTHER:
      return ReformCause::kOther;
    default:
      return ReformCause::kUnknown;
  }
}

// This node's place in the verdict.
absl::StatusOr<Reformed> ApplyVerdict(const ReformOptions& o,
                                      const EpochKeys& keys,
                                      const v1::ElasticMembers& verdict) {
  if (verdict.failed()) return absl::FailedPreconditionError(verdict.error());
  for (const v1::ElasticRefusal& r : verdict.refused()) {
    if (r.node_id() == o.node_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("not admitted into the running job: ", r.reason()));
    }
  }
  Reformed out;
  out.epoch = o.epoch;
  out.store_prefix = keys.prefix;
  out.max_completed = verdict.max_completed();
  out.behind = o.completed_iteration < verdict.max_completed();
  out.sync_seq = verdict.sync_seq();
  out.lost.assign(verdict.lost().begin(), verdict.lost().end());
  out.admitted.assign(verdict.admitted().begin(), verdict.admitted().end());
  out.arrivals_seen = verdict.arrivals_seen();
  out.initial_world_size = verdict.initial_world_size();
  out.cause = CauseOf(verdict.cause());
  for (const v1::ElasticEntrant& e : verdict.departed()) {
    out.departed.push_back(e.node_id());
  }
  out.reason = verdict.reason().empty() ? o.reason : verdict.reason();
  JobLayout& layout = out.layout;
  layout.node_rank = -1;
  for (const v1::ElasticEntrant& e : verdict.entrants()) {
    const int rank = static_cast<int>(layout.nodes.size());
    layout.nodes.push_back(JobNode{e.node_id(), rank, e.local_world_size(),
                                   e.global_rank_offset()});
    layout.world_size += e.local_world_size();
    if (e.node_id() == o.node_id) {
      layout.node_rank = rank;
      layout.global_rank_offset = e.global_rank_offset();
    }
  }
  layout.num_nodes = static_cast<int>(layout.nodes.size());
  if (layout.node_rank < 0) {
    return absl::AbortedError(absl::StrCat(
        "this node is not among the epoch's members (",
        absl::StrJoin(layout.NodeIds(), ", "), "); form the job again"));
  }
  return out;
}

// New node rank 0 republishes the job's plan; an arrival adopts it.
absl::Status SharePlan(RendezvousStoreInterface& store, const ReformOptions& o,
                       const EpochKeys& keys, absl::Time deadline,
                       Reformed* out) {
  out->plan = o.plan;
  if (out->layout.node_rank == 0) {
    if (!o.plan.has_value()) return absl::OkStatus();
    return Prefixed(store.Set(o.job_id, keys.Plan(), SerializePlan(*o.plan)),
                    "publishing the bucket plan");
  }
  if (IsSurvivor(o)) return absl::OkStatus();
  const std::string& leader = out->layout.nodes[0].node_id;
  absl::StatusOr<std::string> bytes =
      store.Get(o.job_id, keys.Plan(), std::max(Left(deadline), kMinStep));
  if (!bytes.ok()) {
    return Prefixed(bytes.status(),
                    absl::StrCat("waiting for the bucket plan of '", leader,
                                 "' (node rank 0)"));
  }
  absl::StatusOr<BucketPlan> plan = ParsePlan(*bytes, o.params);
  if (!plan.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the bucket plan of '", leader,
                     "' (node rank 0) does not fit this node's model: ",
                     plan.status().message()));
  }
  out->plan = *std::move(plan);
  return absl::OkStatus();
}

absl::Status ConnectBackend(RendezvousStoreInterface& store,
                            const ReformOptions& o, const EpochKeys& keys,
                            absl::Time deadline, Reformed* out) {
  GlooBackend::Options gloo;
  gloo.store = &store;
  gloo.job_id = o.job_id;
  gloo.store_prefix = keys.Gloo();
  gloo.node_rank = out->layout.node_rank;
  gloo.num_nodes = out->layout.num_nodes;
  gloo.advertise_host = o.advertise_host;
  gloo.connect_timeout = std::max(Left(deadline), kMinStep);
  gloo.collective_timeout = o.collective_timeout;
  gloo.node_names = out->layout.NodeIds();
  // No failure probe: the next re-formation finds the lost nodes itself
  // (NodeFormationOptions::elastic).
  gloo.failure_probe_timeout = absl::ZeroDuration();
  // As FormNodeJob: bcube between two nodes (measured there).
  if (gloo.num_nodes == 2) gloo.algorithm = GlooBackend::Algorithm::kBcube;
  ASSIGN_OR_RETURN(std::unique_ptr<GlooBackend> backend,
                   GlooBackend::Create(gloo));
  out->backend = std::move(backend);
  return absl::OkStatus();
}

// One try at epoch `o.epoch`: nullopt when this node came too late for it.
absl::StatusOr<std::optional<Reformed>> EnterEpoch(
    RendezvousStoreInterface& store, const ReformOptions& o,
    absl::Time deadline) {
  const EpochKeys keys = KeysOf(o.reformation_prefix, o.epoch);
  const absl::Time entered = absl::Now();
  if (store.HasLeases()) RETURN_IF_ERROR(StillRunning(store, o));
  RETURN_IF_ERROR(store.Set(o.job_id, keys.Member(o.node_id),
                            MemberOf(o).SerializeAsString()));
  ASSIGN_OR_RETURN(int64_t slot, store.Add(o.job_id, keys.Joined(), 1));
  if (!store.HasLeases() && slot > kClosedBias) {
    (void)store.Delete(o.job_id, keys.Member(o.node_id));
    return std::optional<Reformed>();
  }
  RETURN_IF_ERROR(store.Set(o.job_id, keys.Slot(slot - 1), o.node_id));

  std::optional<v1::ElasticMembers> verdict;
  if (store.HasLeases()) {
    ASSIGN_OR_RETURN(verdict,
                     AgreeByTransaction(store, o, keys, entered, deadline));
    if (!verdict.has_value()) return std::optional<Reformed>();  // too late
    // This node's liveness in the job, under its daemon's lease (an
    // arrival's first; a survivor's again, in case its lease was replaced).
    RETURN_IF_ERROR(
        MarkAlive(store, o.job_id, o.reformation_prefix, o.node_id));
  } else if (IsSurvivor(o)) {
    ASSIGN_OR_RETURN(int64_t closers, store.Add(o.job_id, keys.Closed(), 1));
    if (closers == 1) {
      ASSIGN_OR_RETURN(verdict, CloseEpoch(store, o, keys, entered, deadline));
    }
  }
  if (!verdict.has_value()) {
    ASSIGN_OR_RETURN(verdict, AwaitVerdict(store, o, keys, deadline));
  }
  ASSIGN_OR_RETURN(Reformed out, ApplyVerdict(o, keys, *verdict));
  RETURN_IF_ERROR(SharePlan(store, o, keys, deadline, &out));
  RETURN_IF_ERROR(ConnectBackend(store, o, keys, deadline, &out));
  return std::optional<Reformed>(std::move(out));
}

// A node too late for its epoch (or whose announcement an epoch settled
// without it) asks to be admitted into a later one, as an arrival that
// keeps its old offsets if they are still free. Announcing again makes the
// running nodes break for it.
absl::Status AskAgain(RendezvousStoreInterface& store, ReformOptions& o) {
  for (const JobNode& node : o.previous) {
    if (node.node_id == o.node_id) o.requested_offset = node.global_rank_offset;
  }
  o.previous.clear();
  ASSIGN_OR_RETURN(o.arrival, AnnounceArrival(store, o));
  return absl::OkStatus();
}

// Resolves epoch 0 ("the next one", but at least `floor`: "epoch" may
// not say yet that the epoch this node was too late for is closed) and an
// epoch closed already.
absl::Status ChooseEpoch(RendezvousStoreInterface& store, uint64_t floor,
                         ReformOptions& o) {
  ASSIGN_OR_RETURN(uint64_t last,
                   LastClosedEpoch(store, o.job_id, o.reformation_prefix));
  if (o.epoch != 0 && last >= o.epoch) {
    RETURN_IF_ERROR(AskAgain(store, o));
  } else if (o.epoch == 0 && o.arrival > 0) {
    const std::optional<v1::ElasticMembers> verdict =
        StoredVerdict(store, o.job_id, o.reformation_prefix, last);
    if (verdict.has_value() && verdict->arrivals_seen() >= o.arrival) {
      RETURN_IF_ERROR(AskAgain(store, o));
    }
  }
  if (o.epoch == 0 || last >= o.epoch) o.epoch = std::max(last + 1, floor);
  return absl::OkStatus();
}

}  // namespace

std::string ReformationPrefix(const std::string& round_prefix) {
  if (absl::StartsWith(round_prefix, "round")) {
    return absl::StrCat("elastic", round_prefix.substr(5));
  }
  return absl::StrCat("elastic-", round_prefix);
}

absl::Status MarkRunning(RendezvousStoreInterface& store,
                         const std::string& job_id,
                         const std::string& reformation_prefix,
                         const std::string& round_prefix,
                         const std::string& node_id) {
  const std::string where =
      absl::StrCat("marking job '", job_id, "' running elastically");
  RETURN_IF_ERROR(Prefixed(
      store.Set(job_id, RunningKey(reformation_prefix), round_prefix), where));
  if (!store.HasLeases()) return absl::OkStatus();
  return Prefixed(MarkAlive(store, job_id, reformation_prefix, node_id), where);
}

absl::StatusOr<std::string> FindRunning(RendezvousStoreInterface& store,
                                        const std::string& job_id,
                                        absl::Duration timeout) {
  const std::string where =
      absl::StrCat("looking for running job '", job_id, "'");
  // A no-op that waits out a coordinator still starting (as OpenRound
  // does), so the quick probes below see the store itself.
  if (absl::StatusOr<int64_t> up = store.Add(job_id, "rounds/probe", 0);
      !up.ok()) {
    return Prefixed(up.status(), where);
  }
  // Rounds k = 1, 2, ... that were used carry a closed mark (OpenRound);
  // the newest of them with a running mark is the job's.
  std::optional<std::string> found;
  const absl::Time deadline = absl::Now() + timeout;
  for (int k = 1; absl::Now() < deadline; ++k) {
    ASSIGN_OR_RETURN(
        std::optional<std::string> closed,
        Probe(store, job_id, absl::StrCat("round", k, "/closed"), kProbe));
    if (!closed.has_value()) break;
    const std::string prefix = ReformationPrefix(absl::StrCat("round", k));
    ASSIGN_OR_RETURN(std::optional<std::string> running,
                     Probe(store, job_id, RunningKey(prefix), kProbe));
    if (running.has_value()) found = prefix;
  }
  if (!found.has_value()) {
    return absl::NotFoundError(
        absl::StrCat(where, ": it is not running elastically"));
  }
  return *found;
}

absl::StatusOr<int64_t> AnnounceArrival(RendezvousStoreInterface& store,
                                        const ReformOptions& options) {
  const std::string where = absl::StrCat("announcing node '", options.node_id,
                                         "' to job '", options.job_id, "'");
  // First under a key the coordinator checks against rendezvous.expected_
  // node_ids ("<prefix>/member/<id>", FormationNodeIdOf), so that a node it
  // would refuse is refused before the running nodes break for it.
  const std::string serialized = MemberOf(options).SerializeAsString();
  if (absl::Status s =
          store.Set(options.job_id,
                    absl::StrCat(options.reformation_prefix, "/arrival/member/",
                                 options.node_id),
                    serialized);
      !s.ok()) {
    return Prefixed(s, where);
  }
  absl::StatusOr<int64_t> n =
      store.Add(options.job_id, ArrivalsKey(options.reformation_prefix), 1);
  if (!n.ok()) return Prefixed(n.status(), where);
  if (absl::Status s =
          store.Set(options.job_id, ArrivalKey(options.reformation_prefix, *n),
                    serialized);
      !s.ok()) {
    return Prefixed(s, where);
  }
  return *n;
}

absl::Status Beat(RendezvousStoreInterface& store, const std::string& job_id,
                  const std::string& reformation_prefix,
                  const std::string& node_id) {
  return store.Add(job_id, AliveKey(reformation_prefix, node_id), 1).status();
}

absl::Status MarkAlive(RendezvousStoreInterface& store,
                       const std::string& job_id,
                       const std::string& reformation_prefix,
                       const std::string& node_id) {
  return store.SetOwn(job_id, AliveKey(reformation_prefix, node_id), node_id);
}

absl::Status LeaveJob(RendezvousStoreInterface& store,
                      const std::string& job_id,
                      const std::string& reformation_prefix,
                      const std::string& node_id) {
  if (!store.HasLeases()) return absl::OkStatus();
  RETURN_IF_ERROR(
      store.Delete(job_id, AliveKey(reformation_prefix, node_id)).status());
  ASSIGN_OR_RETURN(int64_t live,
                   store.CountPrefix(job_id, AliveKey(reformation_prefix, "")));
  if (live > 0) return absl::OkStatus();
  // The last node of the job to leave: the job's keys go.
  ASSIGN_OR_RETURN(int64_t gone, store.DeletePrefix(job_id, ""));
  spdlog::debug("job '{}': the last node left; {} keys deleted from {}", job_id,
                gone, store.Describe());
  return absl::OkStatus();
}

absl::Status WaitForArrival(RendezvousStoreInterface& store,
                            const std::string& job_id,
                            const std::string& reformation_prefix, int64_t next,
                            absl::Duration timeout) {
  const std::string where = absl::StrCat(
      "job '", job_id, "' waiting for arriving node number ", next);
  // The counter first: arrival keys at or below a settled number may be
  // deleted already.
  absl::StatusOr<int64_t> announced =
      store.Add(job_id, ArrivalsKey(reformation_prefix), 0);
  if (!announced.ok()) return Prefixed(announced.status(), where);
  if (*announced >= next) return absl::OkStatus();
  return Prefixed(
      store.Wait(job_id, {ArrivalKey(reformation_prefix, next)}, timeout),
      where);
}

absl::StatusOr<Reformed> ReformNodeJob(RendezvousStoreInterface& store,
                                       const ReformOptions& options) {
  ReformOptions o = options;
  const absl::Time deadline = absl::Now() + o.timeout;
  if (o.job_id.empty() || o.node_id.empty() || o.reformation_prefix.empty() ||
      o.local_world_size < 1 || o.min_nodes < 1 || o.max_nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(o),
                     ": job id, node id and elastic prefix are required, and "
                     "local_world_size, min_nodes and max_nodes must be >= 1"));
  }
  if (o.epoch == 0 && !o.previous.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(o), ": epoch 0 (\"the next one\") is for arrivals only"));
  }
  uint64_t floor = 1;
  while (true) {
    if (absl::Status s = ChooseEpoch(store, floor, o); !s.ok()) {
      return Prefixed(s, Where(o));
    }
    absl::StatusOr<std::optional<Reformed>> reformed =
        EnterEpoch(store, o, deadline);
    if (!reformed.ok()) return Prefixed(reformed.status(), Where(o));
    if (reformed->has_value()) return **std::move(reformed);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(Where(o), ": came too late for every epoch within ",
                       absl::FormatDuration(options.timeout)));
    }
    spdlog::info("{}: too late for it; trying a later epoch", Where(o));
    if (absl::Status s = AskAgain(store, o); !s.ok()) {
      return Prefixed(s, Where(o));
    }
    floor = o.epoch + 1;
    o.epoch = 0;
  }
}

}  // namespace gradd
