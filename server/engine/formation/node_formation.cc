#include "server/engine/formation/node_formation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/backends/gloo/gloo_backend.h"
#include "server/engine/formation/bucket_specs.h"

namespace gradd {
namespace {

constexpr size_t kPage = 4096;
// Every later step gets at least this long, even when FormJob used up most
// of the formation timeout (the others are then just as late and arrive soon).
constexpr absl::Duration kMinStep = absl::Seconds(2);
// Formation rounds one job id may go through in one coordinator's life
// (each costs OpenRound one store lookup).
constexpr int kMaxRounds = 10000;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

absl::Status Prefixed(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

absl::StatusOr<std::string> OpenRound(RendezvousStoreInterface& store,
                                      const std::string& job_id) {
  // A no-op that waits out a coordinator still starting (the client retries
  // UNAVAILABLE for its connect timeout), so the quick probes below see the
  // store itself.
  if (absl::StatusOr<int64_t> up = store.Add(job_id, "rounds/probe", 0);
      !up.ok()) {
    return Prefixed(up.status(), absl::StrCat("forming job '", job_id, "'"));
  }
  for (int k = 1; k <= kMaxRounds; ++k) {
    const std::string prefix = absl::StrCat("round", k);
    absl::StatusOr<std::string> closed = store.Get(
        job_id, absl::StrCat(prefix, "/closed"), absl::Milliseconds(1));
    if (closed.ok()) continue;
    if (closed.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return Prefixed(closed.status(),
                      absl::StrCat("forming job '", job_id, "'"));
    }
    return prefix;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("forming job '", job_id, "': all ", kMaxRounds,
                   " formation rounds are used up; restart the coordinator"));
}

void CloseRound(RendezvousStoreInterface& store, const std::string& job_id,
                const std::string& prefix, const std::string& why) {
  (void)store.Set(job_id, absl::StrCat(prefix, "/closed"), why);
}

std::vector<v1::ParamSpec> Fingerprint(const std::vector<ParamInfo>& params) {
  std::vector<v1::ParamSpec> out;
  out.reserve(params.size());
  for (const ParamInfo& p : params) {
    v1::ParamSpec spec;
    spec.set_name(p.name);
    for (int64_t d : p.shape) spec.add_shape(d);
    spec.set_dtype(static_cast<v1::DType>(p.dtype));
    spec.set_device(static_cast<v1::DeviceKind>(p.device));
    out.push_back(std::move(spec));
  }
  return out;
}

std::string SerializePlan(const BucketPlan& plan) {
  v1::AttachResponse msg;
  AppendBucketSpecs(plan, msg.mutable_buckets());
  msg.set_rank_memory_bytes(plan.total_bytes);
  msg.set_device_memory_bytes(plan.device_bytes);
  return msg.SerializeAsString();
}

absl::StatusOr<BucketPlan> ParsePlan(const std::string& bytes,
                                     const std::vector<ParamInfo>& params) {
  v1::AttachResponse msg;
  if (!msg.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("the plan is not a valid message");
  }
  size_t payload = 0;
  for (const ParamInfo& p : params) payload += p.bytes();
  // What the planner could need at most: every bucket padded to the
  // alignment, then the page rounding.
  const size_t limit =
      RoundUp(payload + msg.buckets_size() * kBucketAlignment, kPage) + kPage;
  for (uint64_t need : {msg.rank_memory_bytes(), msg.device_memory_bytes()}) {
    if (need > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("the plan needs ", need,
                       " bytes per rank; the parameters need at most ", limit));
    }
  }
  BucketPlan plan;
  plan.total_bytes = msg.rank_memory_bytes();
  plan.device_bytes = msg.device_memory_bytes();
  std::vector<bool> seen(params.size(), false);
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (int b = 0; b < msg.buckets_size(); ++b) {
    const v1::BucketSpec& in = msg.buckets(b);
    const std::string where = absl::StrCat("bucket ", b);
    absl::StatusOr<DType> dtype = DTypeFromInt(in.dtype());
    if (!dtype.ok()) return Prefixed(dtype.status(), where);
    absl::StatusOr<DeviceKind> device = DeviceKindFromInt(in.device());
    if (!device.ok()) return Prefixed(device.status(), where);
    // Each device kind has its own memory; the bucket must fit its own.
    const uint64_t region =
        *device == DeviceKind::kCuda ? plan.device_bytes : plan.total_bytes;
    if (in.param_indices_size() != in.param_offsets_size() ||
        in.param_indices_size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " has ", in.param_indices_size(), " parameters and ",
          in.param_offsets_size(), " offsets"));
    }
    if (in.offset() % kBucketAlignment != 0 || in.size_bytes() > region ||
        in.offset() > region - in.size_bytes() ||
        in.size_bytes() % DTypeSize(*dtype) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " at offset ", in.offset(), " of ",
                       in.size_bytes(), " bytes does not fit a rank's ", region,
                       " bytes of ", DeviceKindName(*device), " memory"));
    }
    Bucket out;
    out.dtype = *dtype;
    out.device = *device;
    out.offset = in.offset();
    out.size_bytes = in.size_bytes();
    for (int i = 0; i < in.param_indices_size(); ++i) {
      const int32_t p = in.param_indices(i);
      const uint64_t at = in.param_offsets(i);
      if (p < 0 || static_cast<size_t>(p) >= params.size() || seen[p]) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " lists parameter index ", p,
                         p < 0 || static_cast<size_t>(p) >= params.size()
                             ? " which does not exist"
                             : " a second time"));
      }
      const ParamInfo& param = params[p];
      if (param.dtype != *dtype || param.device != *device ||
          at % DTypeSize(*dtype) != 0 || param.bytes() > in.size_bytes() ||
          at > in.size_bytes() - param.bytes()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " (", std::string(DTypeName(*dtype)), ", ",
                         in.size_bytes(), " bytes) cannot hold parameter '",
                         param.name, "' (", std::string(DTypeName(param.dtype)),
                         ", ", param.bytes(), " bytes) at offset ", at));
      }
      seen[p] = true;
      out.params.push_back(p);
      out.param_offsets.push_back(at);
    }
    // Extents in one space: device buckets after every host byte.
    const uint64_t base =
        *device == DeviceKind::kCuda ? plan.total_bytes : uint64_t{0};
    extents.emplace_back(base + in.offset(),
                         base + in.offset() + in.size_bytes());
    plan.buckets.push_back(std::move(out));
  }
  for (size_t p = 0; p < params.size(); ++p) {
    if (!seen[p]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", params[p].name, "' is in none of the buckets"));
    }
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].first < extents[i - 1].second) {
      return absl::InvalidArgumentError(
          absl::StrCat("buckets at offsets ", extents[i - 1].first, " and ",
                       extents[i].first, " overlap"));
    }
  }
  return plan;
}

absl::StatusOr<NodeFormation> FormNodeJob(RendezvousStoreInterface& store,
                                          const NodeFormationOptions& options) {
  const absl::Time deadline = absl::Now() + options.formation_timeout;
  auto left = [&] { return std::max(deadline - absl::Now(), kMinStep); };

  JobFormationOptions form;
  form.job_id = options.job_id;
  form.node_id = options.node_id;
  form.node_rank = options.node_rank;
  form.num_nodes = options.num_nodes;
  form.local_world_size = options.local_world_size;
  form.params = Fingerprint(options.params);
  form.timeout = options.formation_timeout;
  form.expected_node_ids = options.expected_node_ids;
  form.prefix = absl::StrCat(options.prefix, "/members");
  absl::StatusOr<JobLayout> layout = FormJob(store, form);
  if (!layout.ok()) return layout.status();

  NodeFormation out;
  out.layout = *std::move(layout);
  const std::string where = absl::StrCat("forming job '", options.job_id,
                                         "' on node '", options.node_id, "'");
  const std::string plan_key = absl::StrCat(options.prefix, "/plan");
  const std::string& leader = out.layout.nodes[0].node_id;
  if (out.layout.node_rank == 0) {
    out.plan = options.local_plan;
    if (absl::Status s =
            store.Set(options.job_id, plan_key, SerializePlan(out.plan));
        !s.ok()) {
      return Prefixed(s, absl::StrCat(where, ": publishing the bucket plan"));
    }
  } else {
    absl::StatusOr<std::string> bytes =
        store.Get(options.job_id, plan_key, left());
    if (!bytes.ok()) {
      return Prefixed(bytes.status(),
                      absl::StrCat(where, ": waiting for the bucket plan of '",
                                   leader, "' (node rank 0)"));
    }
    absl::StatusOr<BucketPlan> plan = ParsePlan(*bytes, options.params);
    if (!plan.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": the bucket plan of '", leader,
                       "' (node rank 0) does not fit this node's model: ",
                       plan.status().message()));
    }
    out.plan = *std::move(plan);
  }

  GlooBackend::Options gloo;
  gloo.store = &store;
  gloo.job_id = options.job_id;
  gloo.store_prefix = absl::StrCat(options.prefix, "/gloo");
  gloo.node_rank = out.layout.node_rank;
  gloo.num_nodes = out.layout.num_nodes;
  gloo.advertise_host = options.advertise_host;
  gloo.connect_timeout = left();
  gloo.collective_timeout = options.collective_timeout;
  gloo.node_names = out.layout.NodeIds();
  if (options.elastic) gloo.failure_probe_timeout = absl::ZeroDuration();
  if (out.layout.num_nodes == 2) {
    // Between two nodes both algorithms move the same bytes, bcube in fewer,
    // larger steps. Measured with gradd-bench, 2 nodes x 2 trainers, 25 MiB,
    // loopback on 2 cores, ring vs bcube run back to back three times:
    // 55/42, 34/29, 34/28 ms p50.
    gloo.algorithm = GlooBackend::Algorithm::kBcube;
  }
  absl::StatusOr<std::unique_ptr<GlooBackend>> backend =
      GlooBackend::Create(gloo);
  if (!backend.ok()) return Prefixed(backend.status(), where);
  out.backend = *std::move(backend);
  return out;
}

}  // namespace gradd
