#include "server/engine/manager/attach_validation.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/config.h"
#include "server/hooks/comm_hook_factory.h"

namespace gradd {
namespace {

constexpr size_t kMaxJobIdBytes = 256;
constexpr size_t kMaxParamNameBytes = 4096;
constexpr int kMaxDims = 32;
constexpr double kMiB = 1 << 20;
constexpr int kMaxNodes = 65536;
constexpr size_t kMaxNodeIdBytes = 256;

bool JobIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') ||
         absl::string_view("._:@/+=-").find(c) != absl::string_view::npos;
}

std::string DescribeParam(const ParamInfo& p) {
  return absl::StrCat("'", p.name, "' [", absl::StrJoin(p.shape, ", "), "] ",
                      std::string(DTypeName(p.dtype)),
                      p.device == DeviceKind::kCpu ? "" : " on cuda");
}

bool SameParam(const ParamInfo& a, const ParamInfo& b) {
  return a.name == b.name && a.shape == b.shape && a.dtype == b.dtype &&
         a.device == b.device;
}

// First difference between two models, or OK. `head` starts the message;
// `a_name` / `b_name` say whose each model is ("local rank 0", "the job").
absl::Status CompareModels(absl::string_view head, absl::string_view a_name,
                           const std::vector<ParamInfo>& a,
                           absl::string_view b_name,
                           const std::vector<ParamInfo>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (SameParam(a[i], b[i])) continue;
    return absl::InvalidArgumentError(
        absl::StrCat(head, "parameter ", i, " is ", DescribeParam(a[i]), " on ",
                     a_name, " but ", DescribeParam(b[i]), " on ", b_name));
  }
  if (a.size() != b.size()) {
    const bool a_longer = a.size() > b.size();
    const ParamInfo& extra = a_longer ? a[n] : b[n];
    return absl::InvalidArgumentError(absl::StrCat(
        head, a_name, " registered ", a.size(), " parameters and ", b_name,
        " registered ", b.size(), "; parameter ", n, " is ",
        DescribeParam(extra), " on ", a_longer ? a_name : b_name,
        " and missing on ", a_longer ? b_name : a_name));
  }
  return absl::OkStatus();
}

absl::Status CompareModels(const std::string& job_id, int ra,
                           const std::vector<ParamInfo>& a, int rb,
                           const std::vector<ParamInfo>& b) {
  return CompareModels(
      absl::StrCat("local ranks ", ra, " and ", rb, " of job '", job_id,
                   "' registered different models: "),
      absl::StrCat("local rank ", ra), a, absl::StrCat("local rank ", rb), b);
}

double CapOr(double requested, double fallback) {
  return requested > 0 ? requested : fallback;
}

// What the local ranks of one node must agree on for a multi-node job.
std::string NodeSetup(const v1::AttachRequest& r) {
  return absl::StrCat(
      "num_nodes ", NumNodes(r), ", node rank ",
      r.has_node_rank() ? absl::StrCat(r.node_rank()) : std::string("auto"),
      ", node id '", r.node_id(), "', coordinator '", r.coordinator(), "'");
}

}  // namespace

int NumNodes(const v1::AttachRequest& r) { return std::max(1, r.num_nodes()); }

absl::StatusOr<std::vector<ParamInfo>> ValidateAttachRequest(
    const v1::AttachRequest& req, const v1::DaemonConfig& config) {
  const std::string& id = req.job_id();
  if (id.empty()) {
    return absl::InvalidArgumentError("job id is empty");
  }
  if (id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job id is ", id.size(), " bytes; the limit is ", kMaxJobIdBytes));
  }
  for (char c : id) {
    if (!JobIdChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job id '", absl::CEscape(id), "' contains '", absl::CEscape({&c, 1}),
          "'; allowed are letters, digits and ._:@/+=-"));
    }
  }
  const std::string job = absl::StrCat("job '", id, "'");
  if (req.local_world_size() < 1 ||
      static_cast<uint32_t>(req.local_world_size()) >
          config.max_local_world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(job, ": local world size ", req.local_world_size(),
                     " is outside 1..", config.max_local_world_size()));
  }
  if (req.local_rank() < 0 || req.local_rank() >= req.local_world_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        job, ": local rank ", req.local_rank(),
        " is out of range for local world size ", req.local_world_size(),
        " (valid: 0..", req.local_world_size() - 1, ")"));
  }
  const std::string who =
      absl::StrCat("local rank ", req.local_rank(), " of ", job);
  if (req.num_nodes() < 0 || req.num_nodes() > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": num_nodes ", req.num_nodes(), " is outside 0..",
                     kMaxNodes, " (0 = single node)"));
  }
  if (req.has_node_rank() &&
      (req.node_rank() < 0 || req.node_rank() >= NumNodes(req))) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": node rank ", req.node_rank(),
                     " is out of range for ", NumNodes(req), " node(s)"));
  }
  if (req.node_id().size() > kMaxNodeIdBytes ||
      !std::all_of(req.node_id().begin(), req.node_id().end(), JobIdChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": node id '", absl::CEscape(req.node_id()),
                     "' must be at most 256 letters, digits and ._:@/+=-"));
  }
  for (auto [name, cap] :
       {std::pair<const char*, double>{"bucket_cap_mb", req.bucket_cap_mb()},
        {"first_bucket_cap_mb", req.first_bucket_cap_mb()}}) {
    if (!std::isfinite(cap) || cap < 0 || cap > kMiB) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": ", name, " = ", cap, " must be in [0, 1048576] (0 = the ",
          "daemon's default)"));
    }
  }
  if (req.broadcast_bytes() > config.max_job_memory_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": broadcast_bytes ", req.broadcast_bytes(),
                     " exceeds the daemon's per-job memory limit of ",
                     config.max_job_memory_bytes()));
  }
  // No parameters: a collective-only job (e.g. a torch.distributed process
  // group), which only makes sense with a collective area.
  if (req.params().empty() && req.broadcast_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who,
                     " registered no parameters and no collective area "
                     "(broadcast_bytes 0); a collective-only job needs "
                     "collective_bytes > 0"));
  }
  RETURN_IF_ERROR(ValidateCommHookSpec(req.comm_hook(), who));
  if (req.has_rank_restart_grace_ms()) {
    if (req.rank_restart_grace_ms() > kMaxRankRestartGraceMs) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": rank_restart_grace_ms ", req.rank_restart_grace_ms(),
          " is above ", kMaxRankRestartGraceMs, " (one hour)"));
    }
  }
  if (req.has_min_nodes() && NumNodes(req) > 1 &&
      req.min_nodes() > static_cast<uint32_t>(NumNodes(req))) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": min_nodes ", req.min_nodes(), " is above the job's num_nodes ",
        NumNodes(req), " (0 = the job needs all of its nodes)"));
  }
  if (static_cast<uint32_t>(req.params_size()) > config.max_params()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, " registered ", req.params_size(),
                     " parameters; the limit is ", config.max_params()));
  }
  std::vector<ParamInfo> params;
  params.reserve(req.params_size());
  uint64_t total_bytes = 0;
  for (int i = 0; i < req.params_size(); ++i) {
    const v1::ParamSpec& p = req.params(i);
    if (p.name().empty() || p.name().size() > kMaxParamNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": parameter ", i, " has ",
          p.name().empty() ? "an empty name" : "a name over 4096 bytes"));
    }
    absl::StatusOr<DType> dtype = DTypeFromInt(p.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": unsupported dtype ", v1::DType_Name(p.dtype()), " (",
          static_cast<int>(p.dtype()), ") for parameter '", p.name(),
          "' (index ", i, "); supported: float32, float64, float16, bfloat16"));
    }
    absl::StatusOr<DeviceKind> device = DeviceKindFromInt(p.device());
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": parameter '", p.name(), "' (index ", i,
                       "): ", device.status().message()));
    }
    if (*device == DeviceKind::kCuda && req.cuda_device().uuid().size() != 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": parameter '", p.name(), "' is on CUDA but the attach names ",
          req.has_cuda_device() ? "a GPU UUID that is not 16 bytes" : "no GPU",
          " (AttachRequest.cuda_device)"));
    }
    if (p.shape_size() > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": parameter '", p.name(), "' has ", p.shape_size(),
                       " dimensions; the limit is ", kMaxDims));
    }
    uint64_t numel = 1;
    for (int64_t d : p.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": parameter '", p.name(), "' has a negative dimension (",
            absl::StrJoin(p.shape(), ", "), ")"));
      }
      if (d != 0 && numel > config.max_job_memory_bytes() / d) {
        numel = std::numeric_limits<uint64_t>::max();
        break;
      }
      numel *= d;
    }
    const size_t elem = DTypeSize(*dtype);
    if (numel > config.max_job_memory_bytes() / elem ||
        total_bytes + numel * elem > config.max_job_memory_bytes()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(who, ": parameters up to '", p.name(),
                       "' exceed the daemon's per-job memory limit of ",
                       config.max_job_memory_bytes(), " bytes"));
    }
    total_bytes += numel * elem;
    params.push_back(ParamInfo{
        p.name(), {p.shape().begin(), p.shape().end()}, *dtype, *device});
  }
  return params;
}

absl::Status CompareLocalAttach(const std::string& job_id, int r,
                                const v1::AttachRequest& first,
                                const std::vector<ParamInfo>& first_params,
                                const v1::AttachRequest& other,
                                const std::vector<ParamInfo>& other_params,
                                const v1::DaemonConfig& config) {
  absl::Status same = CompareModels(job_id, 0, first_params, r, other_params);
  if (same.ok() &&
      (CapOr(first.bucket_cap_mb(), config.bucket_cap_mb()) !=
           CapOr(other.bucket_cap_mb(), config.bucket_cap_mb()) ||
       CapOr(first.first_bucket_cap_mb(), config.first_bucket_cap_mb()) !=
           CapOr(other.first_bucket_cap_mb(), config.first_bucket_cap_mb()) ||
       AutotunesBucketCap(first, config) !=
           AutotunesBucketCap(other, config))) {
    auto caps = [&config](const v1::AttachRequest& a) {
      return absl::StrCat(AutotunesBucketCap(a, config)
                              ? "auto"
                              : absl::StrCat(a.bucket_cap_mb()),
                          "/", a.first_bucket_cap_mb());
    };
    same = absl::InvalidArgumentError(
        absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                     "' asked for different bucket caps (", caps(first),
                     " MiB vs ", caps(other), " MiB)"));
  }
  if (same.ok() && !google::protobuf::util::MessageDifferencer::Equals(
                       NormalizeCommHookSpec(first.comm_hook()),
                       NormalizeCommHookSpec(other.comm_hook()))) {
    same = absl::InvalidArgumentError(
        absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                     "' asked for different communication hooks ('",
                     DescribeCommHook(first.comm_hook()), "' vs '",
                     DescribeCommHook(other.comm_hook()), "')"));
  }
  if (same.ok() && first.broadcast_bytes() != other.broadcast_bytes()) {
    same = absl::InvalidArgumentError(absl::StrCat(
        "local ranks 0 and ", r, " of job '", job_id,
        "' asked for different broadcast areas (", first.broadcast_bytes(),
        " vs ", other.broadcast_bytes(), " bytes)"));
  }
  if (same.ok() && EffectiveRankRestartGrace(first, config) !=
                       EffectiveRankRestartGrace(other, config)) {
    auto describe = [&](const v1::AttachRequest& r) {
      return r.has_rank_restart_grace_ms()
                 ? absl::StrCat(r.rank_restart_grace_ms())
                 : absl::StrCat(EffectiveRankRestartGrace(r, config),
                                " (the daemon's default)");
    };
    same = absl::InvalidArgumentError(
        absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                     "' asked for different rank_restart_grace_ms (",
                     describe(first), " vs ", describe(other), ")"));
  }
  if (same.ok() &&
      EffectiveMinNodes(first, config) != EffectiveMinNodes(other, config)) {
    auto describe = [&](const v1::AttachRequest& r) {
      return r.has_min_nodes() ? absl::StrCat(r.min_nodes())
                               : absl::StrCat(EffectiveMinNodes(r, config),
                                              " (the daemon's default)");
    };
    same = absl::InvalidArgumentError(
        absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                     "' asked for different min_nodes (", describe(first),
                     " vs ", describe(other), ")"));
  }
  if (same.ok() && NumNodes(first) > 1 &&
      first.divide_by_initial_world_size() !=
          other.divide_by_initial_world_size()) {
    same = absl::InvalidArgumentError(absl::StrCat(
        "local ranks 0 and ", r, " of job '", job_id,
        "' asked for different divide_by_initial_world_size (",
        first.divide_by_initial_world_size() ? "true" : "false", " vs ",
        other.divide_by_initial_world_size() ? "true" : "false", ")"));
  }
  return same;
}

uint32_t EffectiveRankRestartGrace(const v1::AttachRequest& request,
                                   const v1::DaemonConfig& config) {
  if (request.has_rank_restart_grace_ms()) {
    return request.rank_restart_grace_ms();
  }
  return config.rank_restart_grace_ms();
}

int EffectiveMinNodes(const v1::AttachRequest& request,
                      const v1::DaemonConfig& config) {
  const int num_nodes = NumNodes(request);
  if (num_nodes <= 1) return 0;  // a single-node job has no nodes to lose
  if (request.has_min_nodes()) return static_cast<int>(request.min_nodes());
  // The daemon's default, for a job smaller than it: all of its nodes.
  return static_cast<int>(
      std::min<uint32_t>(config.min_nodes(), static_cast<uint32_t>(num_nodes)));
}

bool IsReformableAcrossNodes(int num_nodes, int min_nodes,
                             uint32_t rank_restart_grace_ms) {
  return num_nodes > 1 && (min_nodes > 0 || rank_restart_grace_ms > 0);
}

absl::Status CompareRestartAttach(const std::string& job_id, int rank,
                                  int local_world_size,
                                  const std::vector<ParamInfo>& job_params,
                                  uint64_t broadcast_bytes,
                                  const v1::AttachRequest& request,
                                  const std::vector<ParamInfo>& params) {
  const std::string who =
      absl::StrCat("local rank ", rank, " of job '", job_id, "'");
  if (request.local_world_size() != local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " re-attached with local world size ", request.local_world_size(),
        " but the job runs with ", local_world_size));
  }
  RETURN_IF_ERROR(CompareModels(
      absl::StrCat(who,
                   " re-attached with a different model than the job "
                   "runs: "),
      "the job", job_params, "the re-attaching rank", params));
  if (request.broadcast_bytes() != broadcast_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " re-attached asking for a broadcast/collective area of ",
        request.broadcast_bytes(), " bytes but the job has ", broadcast_bytes,
        " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CompareNodeSetup(const std::string& job_id, int r,
                              const v1::AttachRequest& first,
                              const v1::AttachRequest& other) {
  if (NodeSetup(first) == NodeSetup(other)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("local ranks 0 and ", r, " of job '", job_id,
                   "' disagree on the multi-node setup: ", NodeSetup(first),
                   " vs ", NodeSetup(other)));
}

bool AutotunesBucketCap(const v1::AttachRequest& request,
                        const v1::DaemonConfig& config) {
  return request.follows_plan_switches() &&
         (request.bucket_cap_auto() ||
          (request.bucket_cap_mb() == 0 && config.bucket_cap_auto()));
}

AutotuneOptions AutotuneOptionsOf(const v1::DaemonConfig& config,
                                  bool multi_node) {
  AutotuneOptions options = DefaultAutotuneOptions();
  if (absl::StatusOr<std::vector<double>> caps =
          ParseAutotuneCaps(config.autotune_caps_mb());
      caps.ok()) {
    options.caps.clear();
    for (double mb : *caps) {
      options.caps.push_back(
          std::max<size_t>(1, static_cast<size_t>(mb * kMiB)));
    }
  }
  if (absl::StatusOr<std::vector<double>> partitions =
          ParseAutotunePartitions(config.autotune_partitions_mb());
      multi_node && partitions.ok()) {
    for (double mb : *partitions) {
      options.partitions.push_back(static_cast<size_t>(mb * kMiB));
    }
  }
  if (config.autotune_warmup_iterations() > 0) {
    options.warmup_iterations =
        static_cast<int>(config.autotune_warmup_iterations());
  }
  if (config.autotune_measured_iterations() > 0) {
    options.measured_iterations =
        static_cast<int>(config.autotune_measured_iterations());
  }
  return options;
}

PlannerOptions PlannerOptionsFor(const v1::AttachRequest& request,
                                 const v1::DaemonConfig& config) {
  PlannerOptions options;
  options.bucket_cap_bytes = static_cast<size_t>(
      CapOr(request.bucket_cap_mb(), config.bucket_cap_mb()) * kMiB);
  options.first_bucket_cap_bytes = static_cast<size_t>(
      CapOr(request.first_bucket_cap_mb(), config.first_bucket_cap_mb()) *
      kMiB);
  return options;
}

}  // namespace gradd
