#include "server/metrics/daemon_metrics.h"

#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "prometheus/text_serializer.h"
#include "server/logging.h"
#include "server/rendezvous/etcd/etcd_lease.h"

namespace gradd {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// 10 us .. 10 s: a small bucket's local reduce to a large one's network
// transfer.
Histogram::BucketBoundaries PhaseBoundaries() {
  return {1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
          2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1,    2.5,  5,      10};
}

// 1 ms .. 60 s per training step.
Histogram::BucketBoundaries IterationBoundaries() {
  return {1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
          0.5,  1,      2.5,  5,    10,     30,   60};
}

std::string CodeLabel(absl::StatusCode code) {
  return absl::StatusCodeToString(code);
}

}  // namespace

std::string ReformReasonLabel(const NetworkReformEvent& event,
                              bool new_label_values) {
  // The closer's decision, the same on every node; a closer that did not
  // say (an older daemon, whose text said "rejoined"): what this node can
  // tell.
  std::string label;
  if (event.cause != ReformCause::kUnknown) {
    label = std::string(ReformCauseName(event.cause));
  } else if (!event.lost.empty()) {
    label = "node_lost";
  } else if (!event.admitted.empty()) {
    label = "node_admitted";
  } else if (absl::StrContains(event.reason, "rejoined") ||
             absl::StrContains(event.reason, "restarted")) {
    label = std::string(ReformCauseName(ReformCause::kRankRestarted));
  } else {
    label = "other";
  }
  if (!new_label_values &&
      label == ReformCauseName(ReformCause::kRankRestarted)) {
    return kDeprecatedRankRestartLabel;
  }
  return label;
}

std::string DeprecatedLabelWarning() {
  return absl::StrCat(
      "gradd_job_reformations_total counted a rank restart as reason=\"",
      kDeprecatedRankRestartLabel,
      "\": that label value is deprecated and becomes \"rank_restarted\" "
      "in the next release; set metrics.new_label_values: true to use it now "
      "(docs/deprecations.md)");
}

// One job's series, created when it starts and removed when it ends (this
// object's destruction). Registered under `job_id` only while the daemon
// has fewer than kMaxJobSeries such jobs.
class DaemonMetrics::JobMetrics final : public JobEventSinkInterface {
 public:
  JobMetrics(DaemonMetrics* daemon, const JobInfo& job)
      : daemon_(daemon), memory_(job.shared_memory_bytes), job_id_(job.job_id) {
    daemon_->jobs_.Increment();
    daemon_->shared_memory_bytes_.Increment(static_cast<double>(memory_));
    if (daemon_->job_series_.fetch_add(1) >= kMaxJobSeries) {
      daemon_->job_series_.fetch_sub(1);
      spdlog::warn(
          "job '{}': {} jobs already have job_id metric series; this one "
          "counts only in the daemon-wide ones",
          job.job_id, kMaxJobSeries);
      return;
    }
    const prometheus::Labels labels{{"job_id", job.job_id}};
    buckets_ = &daemon_->buckets_reduced_.Add(labels);
    bytes_ = &daemon_->reduced_bytes_.Add(labels);
    iterations_ = &daemon_->iterations_.Add(labels);
    communication_ = &daemon_->communication_seconds_.Add(labels);
    overlapped_ = &daemon_->overlapped_seconds_.Add(labels);
    overlap_ratio_ = &daemon_->overlap_ratio_.Add(labels);
    world_size_ = &daemon_->job_world_size_.Add(labels);
    world_size_->Set(job.world_size);
    epoch_ = &daemon_->job_epoch_.Add(labels);
    epoch_->Set(static_cast<double>(job.epoch));
    bucket_cap_ = &daemon_->job_bucket_cap_.Add(labels);
    bucket_cap_->Set(static_cast<double>(job.bucket_cap_bytes));
    autotune_state_ = &daemon_->job_autotune_state_.Add(labels);
    autotune_state_->Set(job.autotune ? 1 : 0);
    autotune_trials_ = &daemon_->job_autotune_trials_.Add(labels);
    SetNodes(job.node_ids, job.lost_node_ids);
  }

  ~JobMetrics() override {
    daemon_->jobs_.Decrement();
    daemon_->shared_memory_bytes_.Decrement(static_cast<double>(memory_));
    if (buckets_ == nullptr) return;
    daemon_->buckets_reduced_.Remove(buckets_);
    daemon_->reduced_bytes_.Remove(bytes_);
    daemon_->iterations_.Remove(iterations_);
    daemon_->communication_seconds_.Remove(communication_);
    daemon_->overlapped_seconds_.Remove(overlapped_);
    daemon_->overlap_ratio_.Remove(overlap_ratio_);
    daemon_->job_world_size_.Remove(world_size_);
    daemon_->job_epoch_.Remove(epoch_);
    daemon_->job_bucket_cap_.Remove(bucket_cap_);
    daemon_->job_autotune_state_.Remove(autotune_state_);
    daemon_->job_autotune_trials_.Remove(autotune_trials_);
    for (const auto& [id, gauge] : node_up_)
      daemon_->job_node_up_.Remove(gauge);
    daemon_->job_series_.fetch_sub(1);
  }

  void OnBucket(const BucketEvent& e) override {
    auto observe = [](Histogram& h, const PhaseSpan& span) {
      if (span.start_ns != 0) h.Observe(span.duration_ns / 1e9);
    };
    observe(daemon_->local_reduce_seconds_, e.phases.local_reduce);
    observe(daemon_->network_seconds_, e.phases.network);
    observe(daemon_->write_back_seconds_, e.phases.write_back);
    if (e.phases.negotiations > 0) {
      daemon_->schedule_negotiations_.Increment(e.phases.negotiations);
    }
    if (e.phases.out_of_order) daemon_->buckets_out_of_order_.Increment();
    if (e.first_ready_ns != 0 && e.start_ns >= e.first_ready_ns) {
      daemon_->handover_wait_seconds_.Observe((e.start_ns - e.first_ready_ns) /
                                              1e9);
    }
    if (buckets_ == nullptr) return;
    buckets_->Increment();
    bytes_->Increment(static_cast<double>(e.bytes));
  }

  void OnIteration(const IterationEvent& e) override {
    if (e.step_ns > 0) daemon_->iteration_seconds_.Observe(e.step_ns / 1e9);
    if (buckets_ == nullptr) return;
    iterations_->Increment();
    communication_->Increment(e.communication_ns / 1e9);
    overlapped_->Increment(e.overlapped_ns / 1e9);
    if (e.communication_ns > 0) {
      overlap_ratio_->Set(static_cast<double>(e.overlapped_ns) /
                          static_cast<double>(e.communication_ns));
    }
  }

  void OnStall(const StallReport&) override { daemon_->stalls_.Increment(); }

  void OnAutotune(const AutotuneEvent& e) override {
    if (bucket_cap_ == nullptr) return;
    bucket_cap_->Set(static_cast<double>(e.bucket_cap_bytes));
    autotune_state_->Set(e.settled ? 2 : 1);
    if (!e.settled) autotune_trials_->Increment();
  }

  void OnFailed(absl::StatusCode code, absl::string_view) override {
    daemon_->job_failures_.Add({{"code", CodeLabel(code)}}).Increment();
  }

  void OnRankRestarting(const RankRestartEvent& e) override {
    if (world_size_ != nullptr) world_size_->Set(e.world_size);
  }

  void OnRankRestarted(const RankRestartEvent& e) override {
    daemon_->rank_restarts_.Increment();
    // A rank's return in a multi-node job is one re-formation, whose
    // aborted iteration OnNetworkReformed counts.
    if (e.aborted_iteration != 0 && !e.with_reformation) {
      daemon_->iterations_aborted_.Increment();
    }
    if (world_size_ != nullptr) world_size_->Set(e.world_size);
  }

  void OnNetworkReformed(const NetworkReformEvent& e) override {
    const std::string reason = ReformReasonLabel(e, daemon_->new_label_values_);
    if (reason == kDeprecatedRankRestartLabel &&
        !daemon_->warned_deprecated_label_.exchange(true)) {
      spdlog::warn("{}", DeprecatedLabelWarning());
    }
    daemon_->reformations_.Add({{"reason", reason}}).Increment();
    daemon_->nodes_lost_.Increment(static_cast<double>(e.lost.size()));
    if (e.aborted_iteration != 0) daemon_->iterations_aborted_.Increment();
    if (world_size_ != nullptr) world_size_->Set(e.world_size);
    if (epoch_ != nullptr) epoch_->Set(static_cast<double>(e.epoch));
    if (buckets_ != nullptr) SetNodes(e.node_ids, e.lost_node_ids);
  }

 private:
  // The job's nodes as the event says: live ones 1, lost ones 0 (a node's
  // series stays while the job runs).
  void SetNodes(const std::vector<std::string>& live,
                const std::vector<std::string>& lost) {
    auto node = [&](const std::string& id) -> Gauge& {
      Gauge*& gauge = node_up_[id];
      if (gauge == nullptr) {
        gauge =
            &daemon_->job_node_up_.Add({{"job_id", job_id_}, {"node_id", id}});
      }
      return *gauge;
    };
    for (const std::string& id : live) node(id).Set(1);
    for (const std::string& id : lost) node(id).Set(0);
  }

  DaemonMetrics* const daemon_;
  const uint64_t memory_;
  Counter* buckets_ = nullptr;
  Counter* bytes_ = nullptr;
  Counter* iterations_ = nullptr;
  Counter* communication_ = nullptr;
  Counter* overlapped_ = nullptr;
  Gauge* overlap_ratio_ = nullptr;
  Gauge* world_size_ = nullptr;
  Gauge* epoch_ = nullptr;
  Gauge* bucket_cap_ = nullptr;
  Gauge* autotune_state_ = nullptr;
  Counter* autotune_trials_ = nullptr;
  const std::string job_id_;
  absl::flat_hash_map<std::string, Gauge*> node_up_;
};

namespace {

template <typename Builder>
auto& Register(Builder&& builder, prometheus::Registry& registry,
               const char* name, const char* help) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

DaemonMetrics::DaemonMetrics(bool new_label_values)
    : registry_(std::make_shared<prometheus::Registry>()),
      jobs_(Register(BuildGauge(), *registry_, "gradd_jobs",
                     "Jobs active on this daemon (every local rank attached)")
                .Add({})),
      ranks_attached_(Register(BuildGauge(), *registry_, "gradd_ranks_attached",
                               "Local ranks attached to active jobs")
                          .Add({})),
      shared_memory_bytes_(
          Register(BuildGauge(), *registry_, "gradd_shared_memory_bytes",
                   "Shared memory the daemon holds for active jobs (bucket "
                   "memory of every rank, control blocks)")
              .Add({})),
      attaches_(Register(BuildCounter(), *registry_, "gradd_attaches_total",
                         "Attach calls answered, by status code")),
      detaches_(Register(BuildCounter(), *registry_, "gradd_detaches_total",
                         "Local ranks of active jobs gone, by reason (detach: "
                         "Detach call; disconnect: session closed)")),
      job_failures_(Register(BuildCounter(), *registry_,
                             "gradd_job_failures_total",
                             "Jobs failed, by status code")),
      stalls_(Register(BuildCounter(), *registry_, "gradd_stalls_total",
                       "Buckets that waited longer than stall_warning_ms "
                       "(counted once per bucket and iteration)")
                  .Add({})),
      schedule_negotiations_(
          Register(BuildCounter(), *registry_,
                   "gradd_schedule_negotiations_total",
                   "Small allreduces through which a multi-node job's nodes "
                   "agreed which buckets were ready everywhere (scheduling: "
                   "priority)")
              .Add({})),
      buckets_out_of_order_(
          Register(BuildCounter(), *registry_,
                   "gradd_buckets_out_of_order_total",
                   "Buckets that went to the network before a bucket "
                   "earlier in plan order (scheduling: priority)")
              .Add({})),
      rank_restarts_(
          Register(BuildCounter(), *registry_, "gradd_rank_restarts_total",
                   "Local ranks that went away without Detach and attached "
                   "again to their running job within rank_restart_grace_ms")
              .Add({})),
      iterations_aborted_(
          Register(
              BuildCounter(), *registry_, "gradd_iterations_aborted_total",
              "Gradient iterations that no rank applied because a rank that "
              "restarted came back during them, or the job's nodes re-formed "
              "(a node lost or admitted)")
              .Add({})),
      reformations_(Register(
          BuildCounter(), *registry_, "gradd_job_reformations_total",
          "Re-formations of a multi-node job's group of nodes, by reason: "
          "node_lost, node_admitted, rank_restarted (a rank of a node "
          "restarted; \"rank_rejoined\", deprecated, unless "
          "metrics.new_label_values), other")),
      new_label_values_(new_label_values),
      nodes_lost_(Register(BuildCounter(), *registry_, "gradd_nodes_lost_total",
                           "Nodes a running elastic job went on without "
                           "(counted by every node that went on)")
                      .Add({})),
      rendezvous_requests_(Register(
          BuildCounter(), *registry_, "gradd_rendezvous_requests_total",
          "Requests to this daemon's rendezvous service, by method")),
      rendezvous_backend_(Register(
          BuildGauge(), *registry_, "gradd_rendezvous_backend_info",
          "Where this daemon's rendezvous store is (always 1): backend "
          "builtin (address: the configured coordinator, empty when the "
          "trainers name it per job) or etcd (address: the endpoints; "
          "security: how connections to etcd are secured; prefix: the key "
          "prefix)")),
      etcd_requests_(Register(
          BuildCounter(), *registry_, "gradd_etcd_requests_total",
          "Calls to etcd once over (after retries and failover), by etcd "
          "method and status code")),
      etcd_endpoint_failures_(Register(
          BuildCounter(), *registry_, "gradd_etcd_endpoint_failures_total",
          "Attempts that failed on an etcd endpoint as unavailable or timed "
          "out (member down, no leader, unreachable), after which the call "
          "went on to the next endpoint, by endpoint")),
      etcd_lease_held_(Register(
          BuildGauge(), *registry_, "gradd_etcd_lease_held",
          "1 while this daemon's etcd lease is held: etcd confirmed it less "
          "than a TTL ago and has not said it is gone (updated at each "
          "keep-alive, every TTL/3)")),
      etcd_lease_ttl_(Register(BuildGauge(), *registry_,
                               "gradd_etcd_lease_ttl_seconds",
                               "TTL of this daemon's etcd lease")),
      etcd_lease_info_(Register(
          BuildGauge(), *registry_, "gradd_etcd_lease_info",
          "This daemon's etcd lease (always 1): lease_id in hexadecimal, as "
          "etcdctl prints it; replaced when a lost lease is")),
      etcd_lease_kept_alive_(Register(
          BuildGauge(), *registry_,
          "gradd_etcd_lease_last_keepalive_timestamp_seconds",
          "When etcd last confirmed this daemon's lease (its grant or a "
          "keep-alive answer), Unix time")),
      etcd_lease_grants_(Register(
          BuildCounter(), *registry_, "gradd_etcd_lease_grants_total",
          "etcd leases granted to this daemon: the first, then one for each "
          "lost lease replaced")),
      etcd_lease_losses_(Register(
          BuildCounter(), *registry_, "gradd_etcd_lease_losses_total",
          "Times etcd said this daemon's lease was gone (expired while etcd "
          "was unreachable from here, or refused a write under it)")),
      buckets_reduced_(Register(BuildCounter(), *registry_,
                                "gradd_buckets_reduced_total",
                                "Buckets reduced, per active job")),
      reduced_bytes_(Register(BuildCounter(), *registry_,
                              "gradd_reduced_bytes_total",
                              "Bytes of buckets reduced (one rank's bucket "
                              "size per reduction), per active job")),
      iterations_(Register(BuildCounter(), *registry_, "gradd_iterations_total",
                           "Iterations whose every bucket was reduced, per "
                           "active job")),
      communication_seconds_(Register(
          BuildCounter(), *registry_, "gradd_communication_seconds_total",
          "Time some bucket of the job was being reduced, per "
          "active job")),
      overlapped_seconds_(Register(
          BuildCounter(), *registry_,
          "gradd_communication_overlapped_seconds_total",
          "The part of gradd_communication_seconds_total before the "
          "iteration's last bucket was handed over (overlapping backward)")),
      overlap_ratio_(Register(BuildGauge(), *registry_,
                              "gradd_backward_overlap_ratio",
                              "Fraction of the last iteration's communication "
                              "that overlapped backward, per active job")),
      job_world_size_(Register(
          BuildGauge(), *registry_, "gradd_job_world_size",
          "Ranks of the job taking part now (its world size on every node, "
          "less this node's ranks away restarting), per active job")),
      job_node_up_(Register(
          BuildGauge(), *registry_, "gradd_job_node_up",
          "A node of a multi-node job: 1 while it takes part, 0 once it is "
          "lost and until it is admitted again (the same on every node), "
          "per active job and node id")),
      job_epoch_(Register(
          BuildGauge(), *registry_, "gradd_job_epoch",
          "A multi-node job's network epoch: 0 when it formed, one more at "
          "each re-formation of its nodes' group (the same on every node), "
          "per active job")),
      job_bucket_cap_(Register(
          BuildGauge(), *registry_, "gradd_job_bucket_cap_bytes",
          "The bucket cap of the plan the job runs (autotune changes it), "
          "per active job")),
      job_autotune_state_(Register(
          BuildGauge(), *registry_, "gradd_job_autotune_state",
          "The bucket cap's autotune: 0 a fixed cap, 1 waiting for the "
          "bucket rebuild or trying caps, 2 settled, per active job")),
      job_autotune_trials_(Register(
          BuildCounter(), *registry_, "gradd_job_autotune_trials_total",
          "Plan switches autotune made to try a bucket cap, per active job")),
      phase_seconds_(Register(
          BuildHistogram(), *registry_, "gradd_phase_seconds",
          "Time per bucket in each reduce phase (local_reduce: sum across "
          "local ranks; network: inter-node allreduce, including what the "
          "backend folds into it; write_back: result into every rank's "
          "bucket)")),
      local_reduce_seconds_(
          phase_seconds_.Add({{"phase", "local_reduce"}}, PhaseBoundaries())),
      network_seconds_(
          phase_seconds_.Add({{"phase", "network"}}, PhaseBoundaries())),
      write_back_seconds_(
          phase_seconds_.Add({{"phase", "write_back"}}, PhaseBoundaries())),
      handover_wait_seconds_(
          Register(BuildHistogram(), *registry_, "gradd_handover_wait_seconds",
                   "Per bucket, from the first local rank handing it over to "
                   "the last (how long ranks wait for stragglers)")
              .Add({}, PhaseBoundaries())),
      iteration_seconds_(
          Register(BuildHistogram(), *registry_, "gradd_iteration_seconds",
                   "Training step time as the daemon sees it: from the end "
                   "of one iteration's reduction to the end of the next")
              .Add({}, IterationBoundaries())) {
  // Every label value known in advance is exported from the start (at 0),
  // so the series exist before the first event and rate() sees it.
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated);
       ++c) {
    attaches_.Add({{"code", CodeLabel(static_cast<absl::StatusCode>(c))}});
    if (c != 0) {
      job_failures_.Add(
          {{"code", CodeLabel(static_cast<absl::StatusCode>(c))}});
    }
  }
  for (const char* reason : {"detach", "disconnect"}) {
    detaches_.Add({{"reason", reason}});
  }
  for (const char* method : {"Set", "Get", "Add", "Wait", "Delete"}) {
    rendezvous_requests_.Add({{"method", method}});
  }
  for (const char* reason :
       {"node_lost", "node_admitted",
        new_label_values_ ? "rank_restarted" : kDeprecatedRankRestartLabel,
        "other"}) {
    reformations_.Add({{"reason", reason}});
  }
}

DaemonMetrics::~DaemonMetrics() = default;

void DaemonMetrics::OnAttach(absl::StatusCode code) {
  attaches_.Add({{"code", CodeLabel(code)}}).Increment();
  if (code == absl::StatusCode::kOk) ranks_attached_.Increment();
}

void DaemonMetrics::OnDetach(bool clean) {
  detaches_.Add({{"reason", clean ? "detach" : "disconnect"}}).Increment();
  ranks_attached_.Decrement();
}

std::unique_ptr<JobEventSinkInterface> DaemonMetrics::OnJobStarted(
    const JobInfo& job) {
  return std::make_unique<JobMetrics>(this, job);
}

void DaemonMetrics::OnRendezvousRequest(absl::string_view method) {
  rendezvous_requests_.Add({{"method", std::string(method)}}).Increment();
}

void DaemonMetrics::SetRendezvousBackend(const RendezvousBackend& b) {
  // Empty values are left out, as Prometheus reads them anyway.
  prometheus::Labels labels{{"backend", b.backend}};
  for (const auto& [name, value] :
       {std::pair{"address", &b.address}, std::pair{"security", &b.security},
        std::pair{"prefix", &b.prefix}}) {
    if (!value->empty()) labels.emplace(name, *value);
  }
  rendezvous_backend_.Add(labels).Set(1);
}

void DaemonMetrics::EnableEtcd(const std::vector<std::string>& endpoints,
                               absl::Span<const char* const> methods) {
  absl::MutexLock lock(&etcd_mu_);
  if (etcd_enabled_) return;
  etcd_enabled_ = true;
  for (const char* method : methods) {
    etcd_requests_.Add(
        {{"method", method}, {"code", CodeLabel(absl::StatusCode::kOk)}});
  }
  for (const std::string& endpoint : endpoints) {
    etcd_endpoint_failures_.Add({{"endpoint", endpoint}});
  }
  etcd_lease_held_.Add({});
  etcd_lease_ttl_.Add({});
  etcd_lease_kept_alive_.Add({});
  etcd_lease_grants_.Add({});
  etcd_lease_losses_.Add({});
}

void DaemonMetrics::OnEtcdCall(absl::string_view method,
                               absl::StatusCode code) {
  etcd_requests_
      .Add({{"method", std::string(method)}, {"code", CodeLabel(code)}})
      .Increment();
}

void DaemonMetrics::OnEtcdEndpointFailure(absl::string_view endpoint) {
  etcd_endpoint_failures_.Add({{"endpoint", std::string(endpoint)}})
      .Increment();
}

void DaemonMetrics::OnEtcdLease(EtcdLeaseEvent event,
                                const EtcdLeaseInfo& info) {
  absl::MutexLock lock(&etcd_mu_);
  if (event == EtcdLeaseEvent::kGranted) etcd_lease_grants_.Add({}).Increment();
  if (event == EtcdLeaseEvent::kLost) etcd_lease_losses_.Add({}).Increment();
  etcd_lease_held_.Add({}).Set(info.held ? 1 : 0);
  etcd_lease_ttl_.Add({}).Set(absl::ToDoubleSeconds(info.ttl));
  if (info.last_kept_alive != absl::InfinitePast()) {
    etcd_lease_kept_alive_.Add({}).Set(
        absl::ToDoubleSeconds(info.last_kept_alive - absl::UnixEpoch()));
  }
  // One series: the lease keys go under now (or the one lost, until it is
  // replaced); none once revoked.
  if (info.id != lease_info_id_ || info.id == 0) {
    if (lease_info_ != nullptr) etcd_lease_info_.Remove(lease_info_);
    lease_info_ = nullptr;
    lease_info_id_ = info.id;
    if (info.id != 0) {
      lease_info_ = &etcd_lease_info_.Add(
          {{"lease_id", absl::StrCat(absl::Hex(info.id))}});
      lease_info_->Set(1);
    }
  }
}

std::string DaemonMetrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace gradd
