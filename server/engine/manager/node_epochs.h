// NodeEpochs: what this node's JobManager keeps of a re-formable job's
// epochs (server/engine/README.md, "Glossary"): the live membership and this
// node's place in it, the epoch, whether a re-formation runs, the arrivals
// already settled, and the stall guard. One per re-formable ActiveJob.
//
//   running --Begin (the Job drained and handed over its break)--> re-forming
//      ^                                                              |
//      +---- Adopt (the agreement's verdict; epoch e+1, new members) ---+
//      +---- End (the agreement failed: the Job fails) -----------------+
//
// An arrival (a node asking to be admitted, seen by the watcher) breaks the
// job only while it runs and only when no re-formation has settled it yet
// (BreaksFor). A verdict that leaves the same largest completed iteration
// as the ones before it counts towards ReformationStall: after kMaxInARow
// the job fails instead of re-forming again (Adopt says so).
//
// Pure logic, owned by the control thread, except the two counters the
// watcher thread reads (Watch): the next arrival it waits for and the
// re-formations done, atomics shared with it.
#ifndef GRADD_SERVER_ENGINE_MANAGER_NODE_EPOCHS_H_
#define GRADD_SERVER_ENGINE_MANAGER_NODE_EPOCHS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/manager/reformation_stall.h"
#include "server/rendezvous/job_formation.h"

namespace gradd {

class NodeEpochs {
 public:
  // What the watcher thread reads; it outlives the NodeEpochs if need be.
  struct Watch {
    std::shared_ptr<std::atomic<int64_t>> next_arrival;
    std::shared_ptr<std::atomic<uint64_t>> reformations;
  };

  // The job as formed (or as this node was admitted into it): `members` by
  // node rank, this node's rank, at most `max_nodes` (arrivals are admitted
  // up to it), the arrivals already seen and the epoch.
  NodeEpochs(std::vector<JobNode> members, int node_rank, int max_nodes,
             int64_t arrivals_seen, uint64_t epoch);

  const std::vector<JobNode>& members() const { return members_; }
  int node_rank() const { return node_rank_; }
  const JobNode& self() const { return members_.at(node_rank_); }
  int max_nodes() const { return max_nodes_; }
  uint64_t epoch() const { return epoch_; }
  bool reforming() const { return reforming_; }
  // The fewest nodes a re-formation may go on with: the job's min_nodes, or
  // all of them when it has none (re-formable through its rank restart
  // grace only: a lost node still fails it).
  int min_nodes(int job_min_nodes) const {
    return job_min_nodes > 0 ? job_min_nodes : max_nodes_;
  }
  Watch watch() const { return {next_arrival_, reformations_}; }

  // Whether arrival `n` (the watcher saw it announced) should break the
  // job's group: not while a re-formation runs (it admits the node, or the
  // watcher posts the arrival again after it) and not once one settled it.
  bool BreaksFor(int64_t n) const;

  // A re-formation starts (the Job handed over its break).
  void Begin() { reforming_ = true; }
  // It ended without a new epoch (the agreement failed).
  void End() { reforming_ = false; }
  // It ended with the verdict of epoch `epoch`: `layout` is the new
  // membership, `max_completed` the largest completed iteration of its
  // nodes, `arrivals_seen` the arrivals it took. ABORTED (naming `job_id`,
  // `cause` and the count) when the re-formations stall: then nothing is
  // adopted and the job must fail. Otherwise the new epoch is the live one.
  absl::Status Adopt(const std::string& job_id, const JobLayout& layout,
                     uint64_t epoch, uint64_t max_completed,
                     int64_t arrivals_seen, const std::string& cause);

 private:
  std::vector<JobNode> members_;
  int node_rank_ = 0;
  int max_nodes_ = 1;
  uint64_t epoch_ = 0;
  bool reforming_ = false;
  ReformationStall stall_;
  std::shared_ptr<std::atomic<int64_t>> next_arrival_ =
      std::make_shared<std::atomic<int64_t>>(1);
  std::shared_ptr<std::atomic<uint64_t>> reformations_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_NODE_EPOCHS_H_
