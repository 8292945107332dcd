// DaemonMetrics: the daemon's Prometheus metrics (prometheus-cpp registry),
// fed by the engine's event stream (engine/observe/job_events.h), the
// rendezvous service, and on etcd the etcd client and this daemon's lease
// (rendezvous/etcd/). Every metric is listed, with its meaning, in
// docs/operations.md.
//
// Cardinality is bounded: labels are status codes, phases and rendezvous
// and etcd methods (fixed sets), the configured etcd endpoints, the one
// rendezvous backend and lease id of the daemon (the lease id series is
// replaced when the lease is), and job_id, whose series exist only while
// the job is active on this daemon (removed when it ends) and for at most
// kMaxJobSeries jobs at once (later jobs count only in the daemon-wide
// series).
//
// Threads: everything is safe from any thread. Per-job series are created
// once when the job starts (control thread), so the hot path (OnBucket on
// the completion thread) only adds to atomics and observes histograms
// (prometheus-cpp: one short lock per histogram).
#ifndef GRADD_SERVER_METRICS_DAEMON_METRICS_H_
#define GRADD_SERVER_METRICS_DAEMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/engine/observe/job_events.h"

namespace gradd {

// rendezvous/etcd/etcd_lease.h (not included: it brings gRPC along).
enum class EtcdLeaseEvent : int;
struct EtcdLeaseInfo;

// The reason label of gradd_job_reformations_total for a re-formation: a
// fixed set (node_lost, node_admitted, rank_restarted, other), whatever the
// event's free-text reason says. With `new_label_values` false (this
// release's default, MetricsConfig.new_label_values) a rank restart is
// counted as the deprecated "rank_rejoined".
std::string ReformReasonLabel(const NetworkReformEvent& event,
                              bool new_label_values = true);
// The deprecated label value, and the warning the daemon logs once when it
// first counts it.
inline constexpr char kDeprecatedRankRestartLabel[] = "rank_rejoined";
std::string DeprecatedLabelWarning();

class DaemonMetrics final : public EngineEventSinkInterface {
 public:
  static constexpr int kMaxJobSeries = 256;

  // `new_label_values`: MetricsConfig.new_label_values.
  explicit DaemonMetrics(bool new_label_values = false);
  ~DaemonMetrics() override;

  DaemonMetrics(const DaemonMetrics&) = delete;
  DaemonMetrics& operator=(const DaemonMetrics&) = delete;

  // What an exposer (metrics_endpoint.h) serves.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void OnAttach(absl::StatusCode code) override;
  void OnDetach(bool clean) override;
  // The job's sink; it must not outlive this object.
  std::unique_ptr<JobEventSinkInterface> OnJobStarted(
      const JobInfo& job) override;

  // A rendezvous RPC (Set, Get, Add, Wait, Delete) reached this daemon's
  // rendezvous service.
  void OnRendezvousRequest(absl::string_view method);

  // Where this daemon's rendezvous store is (gradd_rendezvous_backend_info),
  // set once at start. Never a credential.
  struct RendezvousBackend {
    // "builtin" or "etcd".
    std::string backend;
    // builtin: the configured coordinator's host:port ("" when the
    // trainers name it per job); etcd: the endpoints, comma-separated.
    std::string address;
    // etcd: how the connections are secured ("mTLS + user gradd"), and
    // the key prefix.
    std::string security;
    std::string prefix;
  };
  void SetRendezvousBackend(const RendezvousBackend& backend);

  // The rendezvous on etcd: exports the gradd_etcd_* series (at 0, every
  // method's OK count and every endpoint's failures) before the client
  // and lease report anything; call it once, before the etcd client is
  // made. `methods`: EtcdClient::kMethods.
  void EnableEtcd(const std::vector<std::string>& endpoints,
                  absl::Span<const char* const> methods);
  // The etcd client's observers (EtcdClient::Options::on_call,
  // on_endpoint_failure) and the lease's (EtcdLease::Observer).
  void OnEtcdCall(absl::string_view method, absl::StatusCode code);
  void OnEtcdEndpointFailure(absl::string_view endpoint);
  void OnEtcdLease(EtcdLeaseEvent event, const EtcdLeaseInfo& info);

  // The text a scrape returns now (tests, `graddctl`).
  std::string Serialize() const;

 private:
  class JobMetrics;

  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge& jobs_;
  prometheus::Gauge& ranks_attached_;
  prometheus::Gauge& shared_memory_bytes_;
  prometheus::Family<prometheus::Counter>& attaches_;
  prometheus::Family<prometheus::Counter>& detaches_;
  prometheus::Family<prometheus::Counter>& job_failures_;
  prometheus::Counter& stalls_;
  // Multi-node priority scheduling (hierarchical_reducer.h).
  prometheus::Counter& schedule_negotiations_;
  prometheus::Counter& buckets_out_of_order_;
  // Rank restart (daemon-wide): ranks taken back, iterations aborted.
  prometheus::Counter& rank_restarts_;
  prometheus::Counter& iterations_aborted_;
  // Node loss and arrival (daemon-wide): re-formations of a job's nodes'
  // group by reason kind (ReformReasonLabel), nodes lost.
  prometheus::Family<prometheus::Counter>& reformations_;
  const bool new_label_values_;
  std::atomic<bool> warned_deprecated_label_{false};
  prometheus::Counter& nodes_lost_;
  prometheus::Family<prometheus::Counter>& rendezvous_requests_;
  prometheus::Family<prometheus::Gauge>& rendezvous_backend_;
  // The rendezvous on etcd (series only once EnableEtcd ran).
  prometheus::Family<prometheus::Counter>& etcd_requests_;
  prometheus::Family<prometheus::Counter>& etcd_endpoint_failures_;
  prometheus::Family<prometheus::Gauge>& etcd_lease_held_;
  prometheus::Family<prometheus::Gauge>& etcd_lease_ttl_;
  prometheus::Family<prometheus::Gauge>& etcd_lease_info_;
  prometheus::Family<prometheus::Gauge>& etcd_lease_kept_alive_;
  prometheus::Family<prometheus::Counter>& etcd_lease_grants_;
  prometheus::Family<prometheus::Counter>& etcd_lease_losses_;
  absl::Mutex etcd_mu_;
  bool etcd_enabled_ ABSL_GUARDED_BY(etcd_mu_) = false;
  // The lease id series now (gradd_etcd_lease_info), and its id.
  prometheus::Gauge* lease_info_ ABSL_GUARDED_BY(etcd_mu_) = nullptr;
  int64_t lease_info_id_ ABSL_GUARDED_BY(etcd_mu_) = 0;
  // Per job (job_id label).
  prometheus::Family<prometheus::Counter>& buckets_reduced_;
  prometheus::Family<prometheus::Counter>& reduced_bytes_;
  prometheus::Family<prometheus::Counter>& iterations_;
  prometheus::Family<prometheus::Counter>& communication_seconds_;
  prometheus::Family<prometheus::Counter>& overlapped_seconds_;
  prometheus::Family<prometheus::Gauge>& overlap_ratio_;
  prometheus::Family<prometheus::Gauge>& job_world_size_;
  // A multi-node job's nodes: 1 live, 0 lost (and not back).
  prometheus::Family<prometheus::Gauge>& job_node_up_;
  // A multi-node job's network epoch (0 when formed, +1 per re-formation).
  prometheus::Family<prometheus::Gauge>& job_epoch_;
  // The cap of the job's plan; its autotune (0 fixed, 1 tuning, 2
  // settled) and the trials it made.
  prometheus::Family<prometheus::Gauge>& job_bucket_cap_;
  prometheus::Family<prometheus::Gauge>& job_autotune_state_;
  prometheus::Family<prometheus::Counter>& job_autotune_trials_;
  // Daemon-wide histograms.
  prometheus::Family<prometheus::Histogram>& phase_seconds_;
  prometheus::Histogram& local_reduce_seconds_;
  prometheus::Histogram& network_seconds_;
  prometheus::Histogram& write_back_seconds_;
  prometheus::Histogram& handover_wait_seconds_;
  prometheus::Histogram& iteration_seconds_;
  // Jobs that have job_id series now.
  std::atomic<int> job_series_{0};
};

}  // namespace gradd

#endif  // GRADD_SERVER_METRICS_DAEMON_METRICS_H_
