#include "tools/graddctl/format.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace gradd::ctl {
namespace {

// Parameters named per bucket row before "...".
constexpr int kNamesPerBucket = 3;
// Unused parameters and ready orders listed before "... (N more)".
constexpr int kListLimit = 32;

std::string RankStateName(v1::RankState s) {
  switch (s) {
    case v1::RANK_STATE_ATTACHING:
      return "attaching";
    case v1::RANK_STATE_LIVE:
      return "live";
    case v1::RANK_STATE_DETACHED:
      return "detached";
    case v1::RANK_STATE_DISCONNECTED:
      return "disconnected";
    case v1::RANK_STATE_RESTARTING:
      return "restarting";
    default:
      return "unknown";
  }
}

template <typename List>
std::string Limited(const List& items) {
  std::vector<std::string> parts;
  const int n = static_cast<int>(items.size());
  for (int i = 0; i < std::min(n, kListLimit); ++i) {
    parts.push_back(absl::StrCat(items[i]));
  }
  std::string out = absl::StrJoin(parts, ", ");
  if (n > kListLimit)
    absl::StrAppend(&out, ", ... (", n - kListLimit, " more)");
  return out;
}

// One scalar field of `m` as text (reflection: DdpLoggingData).
std::string FieldText(const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f) {
  const google::protobuf::Reflection* r = m.GetReflection();
  using FD = google::protobuf::FieldDescriptor;
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(m, f));
    case FD::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(m, f));
    case FD::CPPTYPE_DOUBLE:
      return absl::StrCat(r->GetDouble(m, f));
    case FD::CPPTYPE_BOOL:
      return r->GetBool(m, f) ? "1" : "0";
    case FD::CPPTYPE_STRING:
      return r->GetString(m, f);
    default:
      return "?";
  }
}

// The rendezvous row of `status`: where the store is.
std::string RendezvousText(const v1::RendezvousStatus& r) {
  if (r.backend() == "etcd") {
    return absl::StrCat("etcd at ", absl::StrJoin(r.etcd_endpoints(), ","),
                        " (", r.etcd_security(), ", prefix ", r.etcd_prefix(),
                        ")");
  }
  std::string out = absl::StrCat(r.backend(), ", coordinator ");
  if (r.coordinator_address().empty()) {
    absl::StrAppend(&out,
                    "named per job by the trainers (GRADD_COORDINATOR, else "
                    "MASTER_ADDR; port ",
                    r.port(), ")");
  } else {
    absl::StrAppend(&out, r.coordinator_address());
  }
  if (!r.serving_address().empty()) {
    absl::StrAppend(&out, "; this daemon serves the store on ",
                    r.serving_address());
  }
  return out;
}

// The etcd lease row of `status`.
std::string LeaseText(const v1::EtcdLeaseStatus& l) {
  std::string out = absl::StrCat(absl::Hex(l.id()));
  if (l.held()) {
    absl::StrAppend(&out, " held");
  } else {
    absl::StrAppend(&out, " NOT HELD (",
                    !l.lost_reason().empty()
                        ? l.lost_reason()
                        : std::string("no answer from etcd for a TTL"),
                    ")");
  }
  absl::StrAppend(&out, ", ttl ", HumanDuration(l.ttl_ms() * 1000000));
  if (l.last_kept_alive_unix_ns() != 0) {
    absl::StrAppend(&out, ", last kept alive ",
                    HumanDuration(l.last_kept_alive_age_ns()), " ago");
  }
  absl::StrAppend(&out, "; granted ", l.grants(), ", lost ", l.losses());
  if (l.failed_keepalives() > 0) {
    absl::StrAppend(&out, "; ", l.failed_keepalives(),
                    " keep-alives unanswered, last: ", l.last_error());
  }
  return out;
}

}  // namespace

std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows,
                  int indent) {
  std::vector<size_t> width(header.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  };
  widen(header);
  for (const auto& row : rows) widen(row);
  auto line = [&](const std::vector<std::string>& row) {
    std::string out(indent, ' ');
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      out += cell;
      if (c + 1 < width.size())
        out += std::string(width[c] - cell.size() + 2, ' ');
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string HumanBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string HumanDuration(int64_t ns) {
  if (ns < 0) return absl::StrCat("-", HumanDuration(-ns));
  if (ns < 1000) return absl::StrCat(ns, " ns");
  if (ns < 1000000) return absl::StrFormat("%.1f us", ns / 1e3);
  if (ns < 1000000000) return absl::StrFormat("%.2f ms", ns / 1e6);
  const int64_t s = ns / 1000000000;
  if (s < 3600) return absl::StrFormat("%.2f s", ns / 1e9);
  if (s < 86400) {
    return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
  }
  return absl::StrFormat("%dd%02dh", s / 86400, s / 3600 % 24);
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options)
           .ok()) {
    return "{}";
  }
  return out + "\n";
}

std::string StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING:
      return "pending";
    case v1::JOB_STATE_FORMING:
      return "forming";
    case v1::JOB_STATE_RUNNING:
      return "running";
    case v1::JOB_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

namespace {

// The engine's phase as job_snapshot.h's JobPhaseName writes it; empty
// before the job formed (or from a daemon older than the field).
std::string PhaseName(v1::JobPhase phase) {
  switch (phase) {
    case v1::JOB_PHASE_RUNNING:
      return "running";
    case v1::JOB_PHASE_SWITCHING_PLAN:
      return "switching_plan";
    case v1::JOB_PHASE_DRAINING:
      return "draining";
    case v1::JOB_PHASE_REFORMING:
      return "reforming";
    case v1::JOB_PHASE_FAILED:
      return "failed";
    default:
      return "";
  }
}

// The header line names the phase only when it says more than the state:
// a running job that is draining, re-forming or switching its plan.
bool PhaseShown(v1::JobPhase phase) {
  return phase == v1::JOB_PHASE_SWITCHING_PLAN ||
         phase == v1::JOB_PHASE_DRAINING || phase == v1::JOB_PHASE_REFORMING;
}

}  // namespace

std::string FormatStatus(const v1::GetStatusResponse& s) {
  const int64_t uptime = s.uptime_ns();
  std::vector<std::vector<std::string>> rows = {
      {"node id", s.node_id()},
      {"socket", s.socket_path()},
      {"pid", absl::StrCat(s.pid())},
      {"uptime", HumanDuration(uptime)},
      {"jobs", absl::StrCat(s.running_jobs(), " running, ", s.pending_jobs(),
                            " pending")},
      {"sessions", absl::StrCat(s.sessions())},
      {"daemon network",
       s.network_security().empty() ? std::string("-") : s.network_security()}};
  // A daemon older than the field leaves it empty: no row.
  if (!s.rendezvous().backend().empty()) {
    rows.push_back({"rendezvous", RendezvousText(s.rendezvous())});
    if (s.rendezvous().has_lease()) {
      rows.push_back({"etcd lease", LeaseText(s.rendezvous().lease())});
    }
  }
  return Table({"gradd", s.version()}, rows);
}

std::string FormatJobs(const v1::ListJobsResponse& jobs) {
  if (jobs.jobs().empty()) return "no jobs\n";
  std::vector<std::vector<std::string>> rows;
  for (const v1::JobSummary& j : jobs.jobs()) {
    rows.push_back(
        {j.job_id(), StateName(j.state()),
         absl::StrCat(j.live_local_ranks(), "/", j.local_world_size()),
         absl::StrCat(j.num_nodes()), absl::StrCat(j.world_size()),
         absl::StrCat(j.iteration()), absl::StrCat(j.num_buckets()),
         HumanBytes(j.bucket_bytes()), absl::StrCat(j.epoch()), j.error()});
  }
  return Table({"ID", "STATE", "RANKS", "NODES", "WORLD", "ITERATION",
                "BUCKETS", "BYTES", "EPOCH", "ERROR"},
               rows);
}

std::string FormatAutotune(const v1::BucketAutotune& a) {
  std::string out = absl::StrCat(
      "bucket cap: ", HumanBytes(a.bucket_cap_bytes()), " (auto, ");
  switch (a.state()) {
    case v1::BucketAutotune::STATE_WAITING:
      absl::StrAppend(&out, "waiting for the bucket rebuild");
      break;
    case v1::BucketAutotune::STATE_TUNING:
      absl::StrAppend(&out, "tuning, trial ", a.trial(), "/", a.trials());
      break;
    case v1::BucketAutotune::STATE_SETTLED:
      absl::StrAppend(&out, "settled after iteration ", a.settled_after());
      break;
    case v1::BucketAutotune::STATE_OFF:
      absl::StrAppend(&out, "off");
      break;
    default:
      absl::StrAppend(&out, "unknown");
      break;
  }
  if (!a.decided_here()) absl::StrAppend(&out, ", node rank 0 decides");
  absl::StrAppend(&out, ")");
  // The network partition (multi-node): 0 sends whole buckets.
  auto partition = [](uint64_t bytes) {
    return bytes == 0 ? std::string("whole buckets")
                      : absl::StrCat("partition ", HumanBytes(bytes));
  };
  if (a.has_partition_bytes()) {
    absl::StrAppend(&out, ", ", partition(a.partition_bytes()));
  }
  std::vector<std::string> tried;
  for (const v1::BucketAutotune::Trial& t : a.trials_done()) {
    tried.push_back(absl::StrCat(
        HumanBytes(t.bucket_cap_bytes()),
        t.has_partition_bytes()
            ? absl::StrCat(" ", partition(t.partition_bytes()))
            : std::string(),
        t.iterations() > 0 ? absl::StrCat(" ", HumanDuration(t.step_ns()))
                           : std::string()));
  }
  if (!tried.empty()) {
    absl::StrAppend(&out, "; step times: ", absl::StrJoin(tried, ", "));
  }
  if (!a.note().empty()) absl::StrAppend(&out, "; ", a.note());
  return absl::StrCat(out, "\n");
}

std::string FormatJob(const v1::JobDetail& d) {
  const v1::JobSummary& s = d.summary();
  std::string out = absl::StrCat(
      "job ", s.job_id(), ": ", StateName(s.state()),
      PhaseShown(s.phase())
          ? absl::StrCat(" (phase ", PhaseName(s.phase()), ")")
          : std::string(),
      ", iteration ", s.iteration(), ", ", s.live_local_ranks(), "/",
      s.local_world_size(), " local ranks live, node ", s.node_rank(), " of ",
      s.num_nodes(), ", world size ", s.world_size(), "\n");
  if (!s.error().empty()) absl::StrAppend(&out, "error: ", s.error(), "\n");
  if (s.rank_restart_grace_ms() > 0 || s.restarts() > 0) {
    absl::StrAppend(&out, "rank restart: grace ", s.rank_restart_grace_ms(),
                    " ms, ", s.restarting_local_ranks(),
                    " local ranks restarting now, ", s.restarts(),
                    " restarts, ", s.iterations_aborted(),
                    " iterations aborted\n");
  }
  if (s.min_nodes() > 0 || s.epoch() > 0) {
    absl::StrAppend(&out, "nodes: epoch ", s.epoch(), ", ", s.num_nodes(),
                    " of ", s.initial_num_nodes(), " live (",
                    absl::StrJoin(s.live_node_ids(), ", "), "), min_nodes ",
                    s.min_nodes(), ", lost: ",
                    s.lost_node_ids().empty()
                        ? std::string("none")
                        : absl::StrJoin(s.lost_node_ids(), ", "),
                    "\n");
    if (!s.last_reformation_reason().empty()) {
      absl::StrAppend(&out, "last re-formation: ", s.last_reformation_reason(),
                      "\n");
    }
  }

  std::vector<std::vector<std::string>> rows;
  for (const v1::RankInfo& r : d.ranks()) {
    rows.push_back(
        {absl::StrCat(r.local_rank()),
         r.global_rank() < 0 ? "-" : absl::StrCat(r.global_rank()),
         r.state() == v1::RANK_STATE_RESTARTING
             ? absl::StrCat("restarting (",
                            absl::StrFormat("%.1f", r.restart_ms_left() / 1e3),
                            " s left)")
             : RankStateName(r.state()),
         r.pid() > 0 ? absl::StrCat(r.pid()) : "-",
         r.pid() > 0 ? absl::StrCat(r.uid()) : "-"});
  }
  absl::StrAppend(&out, "\nranks\n",
                  Table({"LOCAL", "GLOBAL", "STATE", "PID", "UID"}, rows, 2));

  rows.clear();
  for (const v1::NodeInfo& n : d.nodes()) {
    rows.push_back({absl::StrCat(n.node_rank()), n.node_id()});
  }
  absl::StrAppend(&out, "\nnodes\n", Table({"RANK", "ID"}, rows, 2));

  const v1::PlanInfo& plan = d.plan();
  // gradd's used-parameter map is a bucket of the plan but not of the
  // model: say so, as the trainer counts only the model's (train.py).
  absl::StrAppend(
      &out, "\nplan: ", plan.buckets_size(), " buckets",
      d.used_map() ? absl::StrCat(" (", plan.buckets_size() - 1,
                                  " of the model's and gradd's "
                                  "used-parameter map)")
                   : std::string(),
      ", ", HumanBytes(s.bucket_bytes()), " of gradients per rank (",
      HumanBytes(plan.rank_memory_bytes()), " shared memory); caps: first ",
      HumanBytes(plan.first_bucket_cap_bytes()), ", then ",
      HumanBytes(plan.bucket_cap_bytes()), "\n");
  if (s.has_autotune()) absl::StrAppend(&out, FormatAutotune(s.autotune()));
  rows.clear();
  for (const v1::BucketInfo& b : plan.buckets()) {
    std::vector<std::string> names;
    for (int i = 0; i < b.params_size() && i < kNamesPerBucket; ++i) {
      const int p = b.params(i);
      names.push_back(p >= 0 && p < d.parameters_size() ? d.parameters(p).name()
                                                        : absl::StrCat("#", p));
    }
    if (b.params_size() > kNamesPerBucket) names.push_back("...");
    rows.push_back({absl::StrCat(b.index()), b.dtype(),
                    HumanBytes(b.size_bytes()), absl::StrCat(b.params_size()),
                    absl::StrCat(b.done_iteration()),
                    absl::StrCat(b.internal() ? "(gradd) " : "",
                                 absl::StrJoin(names, ", "))});
  }
  absl::StrAppend(
      &out, Table({"BUCKET", "DTYPE", "SIZE", "PARAMS", "DONE", "PARAMETERS"},
                  rows, 2));

  const v1::ReducerTotals& t = d.totals();
  absl::StrAppend(&out, "\nreducer: ", t.buckets_reduced(),
                  " buckets reduced; local_reduce ",
                  HumanDuration(t.local_reduce_ns()), ", network ",
                  HumanDuration(t.network_ns()), ", write_back ",
                  HumanDuration(t.write_back_ns()), "\n");

  if (d.bucket_timings().empty()) {
    absl::StrAppend(&out, "bucket timings: none recorded\n");
  } else {
    rows.clear();
    for (const v1::BucketTiming& bt : d.bucket_timings()) {
      for (const v1::PhaseTiming& p : bt.phases()) {
        rows.push_back(
            {absl::StrCat(bt.bucket()), p.phase(), absl::StrCat(p.count()),
             HumanDuration(p.count() > 0
                               ? p.total_ns() / static_cast<int64_t>(p.count())
                               : 0),
             HumanDuration(p.last_ns()), HumanDuration(p.max_ns())});
      }
    }
    absl::StrAppend(
        &out, "\nbucket timings\n",
        Table({"BUCKET", "PHASE", "COUNT", "AVG", "LAST", "MAX"}, rows, 2));
  }
  absl::StrAppend(&out, "ready order: ",
                  d.ready_order().empty() ? std::string("none recorded")
                                          : Limited(d.ready_order()),
                  "\n");
  if (d.rebuilt()) {
    absl::StrAppend(&out, "rebuild: after iteration ", d.rebuild_iteration(),
                    ", from parameter ready order ",
                    Limited(d.rebuild_ready_order()), "\n");
  } else {
    absl::StrAppend(&out, "rebuild: not rebuilt\n");
  }
  if (!d.used_map()) {
    absl::StrAppend(&out,
                    "unused parameters: not tracked "
                    "(the job has no used map)\n");
  } else if (d.unused_iteration() == 0) {
    absl::StrAppend(&out, "unused parameters: no iteration reduced yet\n");
  } else {
    absl::StrAppend(
        &out, "unused parameters (iteration ", d.unused_iteration(), "): ",
        d.unused_parameters().empty() ? std::string("none")
                                      : Limited(d.unused_parameters()),
        "\n");
  }
  if (d.stalls().empty()) {
    absl::StrAppend(&out, "stalls: none\n");
  } else {
    rows.clear();
    for (const v1::Stall& st : d.stalls()) {
      rows.push_back({absl::StrCat(st.iteration()), absl::StrCat(st.bucket()),
                      absl::StrFormat("%.1f s", st.waited_seconds()),
                      Limited(st.missing_local_ranks()),
                      Limited(st.missing_nodes()),
                      Limited(st.unready_parameters())});
    }
    absl::StrAppend(&out, "\nstalls\n",
                    Table({"ITERATION", "BUCKET", "WAITED", "MISSING RANKS",
                           "MISSING NODES", "UNREADY PARAMETERS"},
                          rows, 2));
  }

  rows.clear();
  const v1::DdpLoggingData& ddp = d.ddp_logging_data();
  const google::protobuf::Descriptor* desc = ddp.GetDescriptor();
  for (int i = 0; i < desc->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = desc->field(i);
    if (f->has_presence() && !ddp.GetReflection()->HasField(ddp, f)) continue;
    std::string text = FieldText(ddp, f);
    // torch leaves out what it does not know (e.g. rebuilt_* before a
    // rebuild); so does the table (--json has every field).
    if (text.empty()) continue;
    rows.push_back({f->name(), std::move(text)});
  }
  absl::StrAppend(&out, "\nddp logging data\n",
                  Table({"KEY", "VALUE"}, rows, 2));
  if (!d.note().empty()) absl::StrAppend(&out, "\nnote: ", d.note(), "\n");
  return out;
}

std::string FormatHealth(
    grpc::health::v1::HealthCheckResponse::ServingStatus status) {
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(status) +
         "\n";
}

}  // namespace gradd::ctl
