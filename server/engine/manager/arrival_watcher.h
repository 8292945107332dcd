// WatchArrivals: the body of a re-formable job's watcher thread
// (JobManager::MakeReformable, job_manager_reformation.cc): nodes asking to
// be admitted into the job, and this node's liveness in it, by which a
// re-formation tells this node from a dead one (formation/reformation.h):
// on the built-in store a beat every kBeatPeriod; on etcd a key under the
// daemon's lease, written again every few seconds only so that a lease
// etcd replaced carries it too (nobody reads its rate), and deleted when
// the job ends here (the last node to leave deletes the job's keys,
// LeaveJob). It owns its own connection to the store, reconnecting after a
// failure, and touches no JobManager state.
#ifndef GRADD_SERVER_ENGINE_MANAGER_ARRIVAL_WATCHER_H_
#define GRADD_SERVER_ENGINE_MANAGER_ARRIVAL_WATCHER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "server/engine/manager/node_epochs.h"
#include "server/rendezvous/coordinator.h"

namespace gradd {

struct ArrivalWatch {
  std::shared_ptr<CoordinatorSelector> selector;
  std::string job_id;
  std::string coordinator;
  std::string reformation_prefix;
  // This node's id in the job.
  std::string node_id;
  // Set when the job's ActiveJob goes: the watcher leaves the job and
  // returns (within a few seconds).
  std::shared_ptr<std::atomic<bool>> stopped;
  // The next arrival to wait for and the re-formations done
  // (NodeEpochs::watch).
  NodeEpochs::Watch watch;
};

// Blocks until *stopped. Calls `on_arrival(n)` once arrival `n` is
// announced (again only after a re-formation ended without settling it);
// `on_arrival` returning false (nobody to tell: the daemon stops) ends the
// watch at once, without leaving the job.
void WatchArrivals(const ArrivalWatch& w,
                   absl::FunctionRef<bool(int64_t)> on_arrival);

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_MANAGER_ARRIVAL_WATCHER_H_
