#include "server/engine/formation/nccl_job_setup.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/logging.h"

#if GRADD_HAVE_CUDA
#include "server/engine/formation/cuda/nccl_job_platform.h"
#endif

namespace gradd {
namespace {

constexpr absl::string_view kConnected = "ok";
constexpr absl::string_view kFailedPrefix = "failed: ";

}  // namespace

std::vector<int> JobGpus(const std::vector<int>& rank_devices) {
  std::vector<int> out;
  for (int d : rank_devices) {
    if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
  }
  return out;
}

absl::StatusOr<NcclJobSetup> SetUpNcclJob(RendezvousStoreInterface& store,
                                          const NcclJobSetupOptions& o,
                                          NcclJobPlatformInterface& platform,
                                          const std::vector<int>& gpus) {
  const std::string job = absl::StrCat("job '", o.job_id, "'");
  const std::string node = absl::StrCat(job, " node rank ", o.node_rank);
  std::string why_not;
  const NcclNodeOffer offer = platform.Offer(gpus, &why_not);

  NcclAgreementOptions agree;
  agree.job_id = o.job_id;
  agree.prefix = o.prefix;
  agree.node_rank = o.node_rank;
  agree.num_nodes = o.num_nodes;
  agree.timeout = o.timeout;
  absl::StatusOr<NcclJobAgreement> agreed = AgreeNcclJob(
      store, agree, offer, [&] { return platform.MakeUniqueId(); });
  if (!agreed.ok()) return agreed.status();

  NcclJobSetup out;
  out.world = agreed->world;
  out.first_rank = agreed->first_rank;
  if (!agreed->use_nccl) {
    out.staged_because = agreed->why_not;
    if (!offer.nccl && !why_not.empty()) {
      absl::StrAppend(&out.staged_because, " (here: ", why_not, ")");
    }
    return out;
  }

  absl::StatusOr<std::unique_ptr<NcclJobCommsInterface>> comms =
      platform.Connect(agreed->unique_id, agreed->world, agreed->first_rank,
                       gpus, o.timeout, node);
  if (comms.ok() && *comms == nullptr) {
    comms = absl::InternalError(absl::StrCat(node, ": no communicators"));
  }

  // Round 3: did every node connect?
  auto init_key = [&](int k) {
    return absl::StrCat(o.prefix, "/nccl/init/", k);
  };
  const std::string mine =
      comms.ok() ? std::string(kConnected)
                 : absl::StrCat(kFailedPrefix, comms.status().ToString());
  auto give_up = [&](absl::Status s) {
    if (comms.ok()) (*comms)->Abort();
    return s;
  };
  if (absl::Status s = store.Set(o.job_id, init_key(o.node_rank), mine);
      !s.ok()) {
    return give_up(absl::Status(
        s.code(), absl::StrCat(node, ": publishing whether NCCL connected: ",
                               s.message())));
  }
  const absl::Time deadline = absl::Now() + o.timeout;
  std::string failed;
  for (int k = 0; k < o.num_nodes; ++k) {
    std::string theirs = mine;
    if (k != o.node_rank) {
      absl::StatusOr<std::string> got =
          store.Get(o.job_id, init_key(k),
                    std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      if (!got.ok()) {
        return give_up(
            absl::Status(got.status().code(),
                         absl::StrCat(node, ": waiting for node rank ", k,
                                      " to report whether NCCL connected: ",
                                      got.status().message())));
      }
      theirs = *std::move(got);
    }
    if (theirs != kConnected && failed.empty()) {
      absl::string_view why = theirs;
      absl::ConsumePrefix(&why, kFailedPrefix);
      failed = absl::StrCat("NCCL did not connect on node rank ", k, ": ", why);
    }
  }
  if (!failed.empty()) {
    if (comms.ok()) (*comms)->Abort();
    out.staged_because = std::move(failed);
    return out;
  }
  out.comms = *std::move(comms);
  return out;
}

absl::StatusOr<std::shared_ptr<NcclJobSetup>> SetUpNcclBetweenNodes(
    RendezvousStoreInterface& store, NcclJobPlatformInterface& platform,
    NcclJobSetupOptions options, const std::vector<int>& rank_devices,
    absl::Time limit) {
  const absl::Duration left = limit - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        absl::StrCat("job '", options.job_id,
                     "': no time left before the Attach deadline to set up "
                     "NCCL between the nodes"));
  }
  options.timeout = std::min(options.timeout, left / 3);
  ASSIGN_OR_RETURN(NcclJobSetup setup, SetUpNcclJob(store, options, platform,
                                                    JobGpus(rank_devices)));
  if (setup.comms == nullptr) {
    spdlog::warn(
        "job '{}' node rank {}: NCCL between the nodes is not used; the "
        "job's CUDA buckets are staged through host memory and reduced by "
        "the host path (Gloo): {}",
        options.job_id, options.node_rank, setup.staged_because);
  } else {
    spdlog::info(
        "job '{}' node rank {}: NCCL between the nodes, NCCL ranks {}..{} "
        "of {}",
        options.job_id, options.node_rank, setup.first_rank,
        setup.first_rank + static_cast<int>(JobGpus(rank_devices).size()) - 1,
        setup.world);
  }
  return std::make_shared<NcclJobSetup>(std::move(setup));
}

std::vector<std::string> NcclJobSetupKeys(const std::string& prefix,
                                          int num_nodes) {
  // nccl_job_agreement.h's keys, then round 3's.
  std::vector<std::string> keys = {absl::StrCat(prefix, "/nccl/id")};
  for (int k = 0; k < num_nodes; ++k) {
    keys.push_back(absl::StrCat(prefix, "/nccl/node/", k));
    keys.push_back(absl::StrCat(prefix, "/nccl/init/", k));
  }
  return keys;
}

absl::StatusOr<std::shared_ptr<NcclJobSetup>> SetUpNcclForGroup(
    RendezvousStoreInterface& store, NcclJobPlatformInterface& platform,
    const std::string& job_id, const std::string& prefix,
    const JobLayout& layout, absl::Duration collective_timeout,
    const std::vector<int>& rank_devices, absl::Time limit) {
  NcclJobSetupOptions options;
  options.job_id = job_id;
  options.prefix = prefix;
  options.node_rank = layout.node_rank;
  options.num_nodes = layout.num_nodes;
  options.timeout = collective_timeout;
  return SetUpNcclBetweenNodes(store, platform, std::move(options),
                               rank_devices, limit);
}

NcclJobPlatformInterface* DaemonNcclJobPlatform() {
#if GRADD_HAVE_CUDA
  static NcclJobPlatformInterface* platform = new CudaNcclJobPlatform(
      nccl::NcclLibrary::Get(), cuda::CudaDriver::Get());
  return platform;
#else
  return nullptr;
#endif
}

}  // namespace gradd
