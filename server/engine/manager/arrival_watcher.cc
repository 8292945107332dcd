#include "server/engine/manager/arrival_watcher.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "server/engine/formation/reformation.h"
#include "server/logging.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {
namespace {

// How long one WaitForArrival of the watcher blocks (its stop flag is read
// and this node's beat is sent between calls: reformation.h, Beat), and
// how long it waits after the store failed.
constexpr absl::Duration kArrivalPoll = kBeatPeriod;
constexpr absl::Duration kWatcherRetry = kBeatPeriod;
// How long one call of the watcher keeps trying an unreachable store (it
// reconnects after a failure; the stop flag waits at most this long).
constexpr absl::Duration kWatcherCallTimeout = absl::Seconds(2);
// On etcd (a store with leases): how often the liveness key is written again
// (see the watcher) and how long one watch for an arrival lasts.
constexpr absl::Duration kLeasedRefresh = absl::Seconds(5);
constexpr absl::Duration kLeasedArrivalPoll = absl::Seconds(1);

}  // namespace

void WatchArrivals(const ArrivalWatch& w,
                   absl::FunctionRef<bool(int64_t)> on_arrival) {
  CoordinatorSelector* const selector = w.selector.get();
  const std::string& job_id = w.job_id;
  const std::string& coordinator = w.coordinator;
  const std::string& reformation_prefix = w.reformation_prefix;
  const std::string& node_id = w.node_id;
  const std::shared_ptr<std::atomic<bool>>& stopped = w.stopped;
  const std::shared_ptr<std::atomic<int64_t>>& next = w.watch.next_arrival;
  const std::shared_ptr<std::atomic<uint64_t>>& reformations =
      w.watch.reformations;
  std::unique_ptr<RendezvousStoreInterface> client;
  int64_t broke_for = 0;           // the arrival last broken for
  uint64_t broke_at = UINT64_MAX;  // ...at this many re-formations
  absl::Time beat_due = absl::InfinitePast();
  while (!stopped->load()) {
    if (client == nullptr) {
      absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> c =
          selector->Connect(coordinator, kWatcherCallTimeout);
      if (!c.ok()) {
        absl::SleepFor(kWatcherRetry);
        continue;
      }
      client = *std::move(c);
      beat_due = absl::InfinitePast();
    }
    const bool leased = client->HasLeases();
    if (absl::Now() >= beat_due) {
      const absl::Status beat =
          leased ? MarkAlive(*client, job_id, reformation_prefix, node_id)
                 : gradd::Beat(*client, job_id, reformation_prefix, node_id);
      if (!beat.ok()) {
        client.reset();  // the store is gone: connect again
        absl::SleepFor(kWatcherRetry);
        continue;
      }
      beat_due = absl::Now() + (leased ? kLeasedRefresh : kBeatPeriod);
    }
    const int64_t n = next->load();
    const uint64_t seen = reformations->load();
    if (n == broke_for && seen == broke_at) {
      // Broken for it already; wait for the re-formation to settle it.
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    // On etcd the wait is a watch: it returns as soon as the arrival is
    // announced, so a longer one only costs the stop's latency.
    absl::Status arrived =
        WaitForArrival(*client, job_id, reformation_prefix, n,
                       leased ? kLeasedArrivalPoll : kArrivalPoll);
    if (arrived.ok()) {
      // The re-formations count now, not before the wait: one that ended
      // while this thread waited did not see this arrival either, and
      // counting it would break a second time for the same node.
      broke_for = n;
      broke_at = reformations->load();
      if (!on_arrival(n)) return;  // the daemon stops
    } else if (!absl::IsDeadlineExceeded(arrived)) {
      client.reset();  // the store is gone: connect again
      absl::SleepFor(kWatcherRetry);
    }
  }
  // The job ended here (or the daemon stops).
  if (client != nullptr) {
    if (absl::Status left =
            LeaveJob(*client, job_id, reformation_prefix, node_id);
        !left.ok()) {
      spdlog::debug("job '{}': leaving it in {}: {}", job_id,
                    client->Describe(), left.message());
    }
  }
}

}  // namespace gradd
