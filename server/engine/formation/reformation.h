// Re-forming a running multi-node job's inter-node group (node loss and
// arrival, and a rank restart on one node of a multi-node job): the nodes
// that are still there, plus nodes that ask to be admitted, agree through
// the rendezvous store on who goes on, then open a fresh Gloo context.
//
// A job is elastic when it has min_nodes >= 1 or a rank restart grace. Its
// nodes keep, besides the job's formation round ("round<k>", node_
// formation.h), an elastic namespace "elastic<k>" (same k) in the job's
// store namespace:
//
//   elastic<k>/running          set once formed: the round's prefix; an
//                               arriving node finds the job through it
//   elastic<k>/arrivals         counter; Add(1) hands out arrival n
//   elastic<k>/arrival/<n>      the n-th arriving node's ElasticMember
//   elastic<k>/arrival/member/<node_id>
//                               the same, written first: the coordinator
//                               checks "/member/<id>" keys against
//                               rendezvous.expected_node_ids, so a node it
//                               refuses never makes the job break (one
//                               small key per arriving node id, kept)
//   elastic<k>/epoch            the last epoch closed (written by its
//                               closer, before "members")
//   elastic<k>/alive/<node_id>  a running node's liveness. Built-in store:
//                               a counter every running node of the job
//                               beats (Beat, Add(1)) every kBeatPeriod
//                               from its arrival watcher, so a closer can
//                               tell a dead node from a slow one. etcd: a
//                               key under the node's daemon lease
//                               (SetOwn), gone when the daemon is and
//                               deleted when the job ends there (LeaveJob)
//   elastic<k>/epoch<e>/...     epoch e's agreement (below)
//
// Who decides an epoch depends on the store (reformation_agreement.h): on
// the built-in store a closer, below; on a store with leases and
// transactions (etcd) any survivor, by a compare-and-swap of "epoch" from
// e - 1 to e that writes "members" with it (no closer, no beats, no
// tombstone; a node the verdict does not name came too late).
//
// Epoch e (e = 1, 2, ...; epoch 0 is the initial formation) is entered by
// every node that broke out of epoch e - 1 (its collectives failed, or it
// broke them on purpose, GlooBackend::Close) and by every arrival
// admitted into it:
//   joined                 counter; Add(1) hands out this node's slot
//   slot/<i>               the node id of the i-th entrant
//   member/<node_id>       its ElasticMember: node id, local world size,
//                          last completed iteration, sync_seq, fingerprint,
//                          global rank offset it asks for (-1: new)
//   closed                 counter; the entrant of the previous epoch
//                          (an arrival never closes: it does not know who
//                          to wait for) whose Add(1) returns 1 is
//                          the closer. It closes when every node of epoch
//                          e - 1 (and every arrival announced before it
//                          entered) has a slot, or once `settle` has passed
//                          since it entered; it stops waiting for a node
//                          of epoch e - 1 whose alive counter has not moved
//                          for `silence` (once it has moved at all: a node
//                          that never beat gets the settle). Then
//                          Add(joined, kClosedBias) fixes
//                          the entrant count n atomically; entrants with a
//                          slot > n are too late for e (they go to e + 1).
//   members                written by the closer: the n entrants in the
//                          order of the new node ranks (the survivors in
//                          their old node-rank order, then arrivals by
//                          node id), each with its global rank offset
//                          (kept; a returning node id gets its old ones
//                          when free -- "departed" below --, a new node
//                          the ones after the highest), the departed
//                          (every node lost and not back, with its last
//                          offset, carried from verdict to verdict), the
//                          agreed sync_seq (the largest any
//                          entrant had, plus one), max_completed (the
//                          largest last completed iteration) and the
//                          job's initial world size (the largest non-zero
//                          one an entrant reported: arrivals report 0, and
//                          every node that knows it knows the same value,
//                          from the job's formation or from the verdict
//                          that admitted it; the largest makes the verdict
//                          independent of which entrant closes and of the
//                          order it read them in). Fewer than
//                          min_nodes entrants: "members" says the job
//                          failed, naming the lost nodes, and every node
//                          fails it.
//   gloo/...               the new GlooBackend (GlooBackend::Create with
//                          store_prefix "elastic<k>/epoch<e>/gloo")
//   plan                   the job's plan, republished by new node rank 0
//
// A node too late for epoch e (its Add(joined) returned more than the
// closer's bias, or "epoch" already says e is closed) announces itself as
// an arrival (keeping its old offsets if they are free) and enters the
// next epoch; the running nodes break for it as for any arrival.
//
// Keys of older epochs are deleted by the closer of epoch e + 1 (best
// effort; "joined" stays as a tombstone so that a very late node cannot
// reopen the epoch); the coordinator's job TTL removes the rest.
//
// The store counts formation rounds by a key's first segment (kv_store.h):
// every key here is in the one round "elastic<k>", which starts with
// MarkRunning, so epochs and arrivals never count against
// max_rounds_per_job_per_minute; "running", "arrivals" and "epoch" keep the
// round alive. Release("round<k>")
// (RendezvousStoreInterface::ReleaseRoundWhenDone) deletes only "round<k>/..."
// keys, so nothing of "elastic<k>" goes while the job runs; after the job, its
// elastic round stays until the job TTL (or a Release("elastic<k>", ...) by
// whoever ends the job).
//
// Thread-safety: plain functions; they block the calling thread (the
// JobManager's formation thread), bounded by the options' timeouts.
#ifndef GRADD_SERVER_ENGINE_FORMATION_REFORMATION_H_
#define GRADD_SERVER_ENGINE_FORMATION_REFORMATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/bucket_planner.h"
#include "server/backends/collective_backend.h"
#include "server/engine/observe/job_events.h"
#include "server/rendezvous/job_formation.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

struct NcclJobSetup;  // nccl_job_setup.h

struct ReformOptions {
  std::string job_id;
  std::string node_id;
  // The job's elastic namespace ("elastic<k>", ReformationPrefix) and the epoch
  // this node enters (the one it ran + 1; an arrival: its admission's).
  std::string reformation_prefix;
  uint64_t epoch = 1;
  // The members of the epoch this node leaves, by node rank (empty for an
  // arrival). Their global rank offsets are kept.
  std::vector<JobNode> previous;
  int local_world_size = 1;
  // The job's initial node count: arrivals are admitted up to it.
  int max_nodes = 1;
  int min_nodes = 1;
  // What this node reports: its last completed gradient iteration and its
  // sync_seq (ControlHeader). An arrival reports 0 / 0.
  uint64_t completed_iteration = 0;
  uint64_t sync_seq = 0;
  // The model fingerprint (checked against the other entrants').
  std::vector<ParamInfo> params;
  // The job's plan on a running node (the new node rank 0 republishes it
  // for arrivals); unset for an arrival.
  std::optional<BucketPlan> plan;
  // -1: any offset (a new node); else the global rank offset this node
  // held before (a returning node id).
  int requested_offset = -1;
  // The job's initial world size (JobSpec::initial_global_world_size): what
  // the closer publishes for arrivals (Reformed::initial_world_size). An
  // arrival reports 0: it does not know it.
  int initial_world_size = 0;
  // Where the others reach this node's Gloo transport, and the backend's
  // bounds (gloo_backend.h).
  std::string advertise_host = "127.0.0.1";
  absl::Duration settle = absl::Seconds(3);
  // The closer stops waiting for a node of `previous` whose beats (Beat)
  // stopped this long ago; zero: it waits the settle for every node.
  absl::Duration silence = absl::ZeroDuration();
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration collective_timeout = absl::Seconds(30);
  // Why this node re-forms, for the log and the other nodes' messages.
  std::string reason;
  // The local ranks whose return (rank restart) made this node break: the
  // closer makes the re-formation a rank restart on every node.
  std::vector<int> restarted_local_ranks;
  // An arrival: the number AnnounceArrival returned (0: unknown). With it,
  // an arrival whose announcement an epoch settled without it (it was too
  // slow) announces itself again, so that the running nodes break for it.
  // ReformNodeJob keeps its own copy up to date when it re-announces.
  int64_t arrival = 0;
};

struct Reformed {
  uint64_t epoch = 0;
  // What the re-formation was, as the closer decided it for every node
  // (ElasticMembers.cause and .reason).
  ReformCause cause = ReformCause::kUnknown;
  std::string reason;
  // The new membership (node_rank = index; global rank offsets kept) and
  // this node's place in it. layout.world_size is the live world size.
  JobLayout layout;
  // The largest last completed iteration of the entrants, and whether this
  // node's is smaller (ControlHeader::state_behind).
  uint64_t max_completed = 0;
  bool behind = false;
  // The sync_seq every node stores (the same everywhere).
  uint64_t sync_seq = 0;
  // Node ids of the previous epoch that did not enter, and of the entrants
  // that were not in it.
  std::vector<std::string> lost;
  std::vector<std::string> admitted;
  // Every node lost in this or an earlier epoch and not back
  // (ElasticMembers.departed), in the order they were lost.
  std::vector<std::string> departed;
  // The fresh inter-node group ("<reformation_prefix>/epoch<e>/gloo").
  std::unique_ptr<CollectiveBackendInterface> backend;
  // The prefix hooks and collective rounds of this epoch agree under
  // ("<reformation_prefix>/epoch<e>").
  std::string store_prefix;
  // The highest arrival number the closer had seen announced and settled
  // (admitted, or refused because the job had max_nodes): the running
  // nodes' watcher waits for the next one.
  int64_t arrivals_seen = 0;
  // For an arrival: the job's plan as the running nodes use it (their
  // node rank 0 republishes it under "<store_prefix>/plan").
  std::optional<BucketPlan> plan;
  // A CUDA job's fresh NCCL communicator among the new group
  // (SetUpNcclForGroup under store_prefix, nccl_job_setup.h): set by the
  // JobManager after ReformNodeJob, on every node of the epoch; null for
  // a job without a device reducer. ReformNodeJob leaves it null.
  std::shared_ptr<NcclJobSetup> nccl;
  // The job's initial world size as the closer published it (the largest
  // any entrant reported; 0: none knew). An arrival keeps it in its
  // JobSpec, so that divide_by_initial_world_size divides by it there as on
  // the nodes that formed the job.
  int initial_world_size = 0;
};

// "elastic<k>" for the job's formation round "round<k>".
std::string ReformationPrefix(const std::string& round_prefix);

// Once formed (every node; node rank 0's write wins, the others are the
// same): marks the job running under `reformation_prefix` so arrivals find it;
// on etcd, writes node `node_id`'s liveness key too.
absl::Status MarkRunning(RendezvousStoreInterface& store,
                         const std::string& job_id,
                         const std::string& reformation_prefix,
                         const std::string& round_prefix,
                         const std::string& node_id);

// An arriving node (its daemon's formation found a running elastic job):
// the running job's elastic prefix, or NOT_FOUND when the job is not
// running elastically under any round (the caller forms normally).
absl::StatusOr<std::string> FindRunning(RendezvousStoreInterface& store,
                                        const std::string& job_id,
                                        absl::Duration timeout);

// An arriving node announces itself; returns its arrival number. The
// running nodes see it through WaitForArrival and break their epoch at
// their next boundary; the arrival then calls ReformNodeJob with epoch 0
// ("the next one": last closed epoch + 1, and the one after that if it
// came too late for it, until `timeout`) and an empty `previous`. A
// running node whose epoch closed without an arrival it had seen
// announced breaks again (Reformed::arrivals_seen).
absl::StatusOr<int64_t> AnnounceArrival(RendezvousStoreInterface& store,
                                        const ReformOptions& options);
// How often a running node beats on the built-in store, and the beat:
// Add(1) on "<reformation_prefix>/alive/<node_id>" (a closer tells a dead node
// from a slow one by it).
inline constexpr absl::Duration kBeatPeriod = absl::Milliseconds(200);
absl::Status Beat(RendezvousStoreInterface& store, const std::string& job_id,
                  const std::string& reformation_prefix,
                  const std::string& node_id);
// On a store with leases (etcd) instead: "<reformation_prefix>/alive/<node_id>"
// under this daemon's lease (SetOwn), gone when the daemon is. Written once
// a node runs (MarkRunning, an epoch entered), and again by the watcher
// only so that a lease etcd replaced carries it too; nobody reads a rate.
absl::Status MarkAlive(RendezvousStoreInterface& store,
                       const std::string& job_id,
                       const std::string& reformation_prefix,
                       const std::string& node_id);
// The job ended on node `node_id` (etcd only; nothing on the built-in
// store, whose job TTL removes the keys): its liveness key goes, and when
// it was the last live node, every key of the job.
absl::Status LeaveJob(RendezvousStoreInterface& store,
                      const std::string& job_id,
                      const std::string& reformation_prefix,
                      const std::string& node_id);

// The running nodes' watcher: waits up to `timeout` for arrival number
// `next` (1, 2, ...) to be announced; OK when it was, DEADLINE_EXCEEDED
// when not yet, another error when the store is gone.
absl::Status WaitForArrival(RendezvousStoreInterface& store,
                            const std::string& job_id,
                            const std::string& reformation_prefix, int64_t next,
                            absl::Duration timeout);

// The agreement of epoch `options.epoch` and the new backend (see above).
// Errors: FAILED_PRECONDITION (fewer than min_nodes entered: names the lost
// nodes and the reason; a fingerprint mismatch), DEADLINE_EXCEEDED (no
// "members" within `timeout`), UNAVAILABLE (the store is gone), and
// GlooBackend::Create's.
[[nodiscard]] absl::StatusOr<Reformed> ReformNodeJob(
    RendezvousStoreInterface& store, const ReformOptions& options);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_FORMATION_REFORMATION_H_
