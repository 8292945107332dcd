#include "server/engine/manager/form_nodes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "server/engine/formation/reformation.h"
#include "server/logging.h"
#include "server/rendezvous/host_addresses.h"

namespace gradd {

absl::StatusOr<FormedNodes> FormNodes(FormNodesRequest request) {
  NodeFormationOptions& options = request.options;
  const std::string job_id = options.job_id;
  CoordinatorSelector* const selector = request.selector.get();
  const std::string& requested = request.coordinator;
  const std::string& advertise = request.advertise_host;
  const std::string& ifname = request.interface;
  const bool elastic = options.elastic;
  NcclJobPlatformInterface* const nccl = request.nccl;
  const absl::Duration settle = request.settle;
  const absl::Time limit = request.limit;
  absl::StatusOr<std::string> found = selector->Resolve(requested);
  if (!found.ok()) {
    return absl::Status(
        found.status().code(),
        absl::StrCat("job '", job_id, "' spans ", options.num_nodes,
                     " nodes but ", found.status().message()));
  }
  const std::string coordinator = *std::move(found);
  absl::StatusOr<std::string> advertised =
      AdvertiseAddress(advertise, ifname, coordinator);
  if (!advertised.ok()) {
    return absl::Status(advertised.status().code(),
                        absl::StrCat("job '", job_id,
                                     "': choosing the address the other "
                                     "nodes reach this one on: ",
                                     advertised.status().message()));
  }
  options.advertise_host = *std::move(advertised);
  spdlog::info("{}", absl::StrCat("job '", job_id, "': node '", options.node_id,
                                  "' joining ", options.num_nodes,
                                  " nodes through ", coordinator, " (Gloo on ",
                                  options.advertise_host, ")"));
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStoreInterface> client,
                   selector->Connect(coordinator, options.formation_timeout));
  if (elastic && request.min_nodes > 0) {
    absl::StatusOr<std::string> running = FindRunning(
        *client, job_id, std::min(options.formation_timeout, absl::Seconds(5)));
    if (running.ok()) {
      ReformOptions admit;
      admit.job_id = job_id;
      admit.node_id = options.node_id;
      admit.reformation_prefix = *running;
      admit.epoch = 0;  // the next one the running nodes open
      admit.local_world_size = options.local_world_size;
      admit.max_nodes = options.num_nodes;
      admit.min_nodes = request.min_nodes;
      admit.params = options.params;
      // The agreement knows returning ids (ElasticMembers.departed).
      admit.requested_offset = -1;
      admit.advertise_host = options.advertise_host;
      admit.settle = settle;
      admit.timeout = options.formation_timeout;
      admit.collective_timeout = options.collective_timeout;
      admit.reason =
          absl::StrCat("node '", options.node_id, "' asks to be admitted");
      spdlog::info("{}", absl::StrCat("job '", job_id, "' runs already (",
                                      *running, "): node '", options.node_id,
                                      "' asks to be admitted"));
      ASSIGN_OR_RETURN(admit.arrival, AnnounceArrival(*client, admit));
      ASSIGN_OR_RETURN(Reformed reformed, ReformNodeJob(*client, admit));
      if (!reformed.plan.has_value()) {
        return absl::InternalError(absl::StrCat(
            "job '", job_id,
            "': admitted into the running job but its plan did not come "
            "with the agreement"));
      }
      FormedNodes out;
      if (nccl != nullptr) {
        // The running nodes connect a fresh communicator of the new
        // group too (JobManager::StartReformation).
        ASSIGN_OR_RETURN(
            out.nccl,
            SetUpNcclForGroup(*client, *nccl, job_id, reformed.store_prefix,
                              reformed.layout, options.collective_timeout,
                              request.rank_devices, limit));
      }
      out.formation.layout = std::move(reformed.layout);
      out.formation.plan = *std::move(reformed.plan);
      out.formation.backend = std::move(reformed.backend);
      NodeAdmission a;
      a.epoch = reformed.epoch;
      a.sync_seq = reformed.sync_seq;
      a.behind = reformed.behind;
      a.store_prefix = reformed.store_prefix;
      a.reformation_prefix = *running;
      a.arrivals_seen = reformed.arrivals_seen;
      a.max_nodes = options.num_nodes;
      a.initial_world_size = reformed.initial_world_size;
      a.lost = reformed.departed;
      // The running nodes abort max_completed + 1 and go on at the
      // next one (Job::AbortInProgress); a job without buckets counts
      // no iterations.
      a.first_iteration =
          out.formation.plan.buckets.empty() ? 1 : reformed.max_completed + 2;
      out.admission = std::move(a);
      out.coordinator = coordinator;
      // "elastic<k>" belongs to formation round "round<k>" (rebuilds
      // agree under it).
      out.round_prefix =
          absl::StrCat("round", absl::StripPrefix(*running, "elastic"));
      for (const std::string& round : {out.round_prefix, *running}) {
        absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> holder =
            selector->Connect(coordinator, options.formation_timeout);
        if (!holder.ok()) continue;
        (*holder)->ReleaseRoundWhenDone(job_id, round, options.node_id,
                                        options.num_nodes);
        out.releases.push_back(*std::move(holder));
      }
      out.store = std::move(client);
      return out;
    }
    if (!absl::IsNotFound(running.status())) return running.status();
  }
  ASSIGN_OR_RETURN(options.prefix, OpenRound(*client, job_id));
  absl::StatusOr<NodeFormation> formed = FormNodeJob(*client, options);
  if (formed.ok() && elastic) {
    // Arrivals find the job through it (every node writes the same).
    if (absl::Status marked =
            MarkRunning(*client, job_id, ReformationPrefix(options.prefix),
                        options.prefix, options.node_id);
        !marked.ok()) {
      formed = marked;
    }
  }
  FormedNodes out;
  if (formed.ok() && nccl != nullptr) {
    absl::StatusOr<std::shared_ptr<NcclJobSetup>> set_up = SetUpNcclForGroup(
        *client, *nccl, job_id, options.prefix, formed->layout,
        options.collective_timeout, request.rank_devices, limit);
    if (set_up.ok()) {
      out.nccl = *std::move(set_up);
    } else {
      formed = set_up.status();
    }
  }
  CloseRound(*client, job_id, options.prefix,
             formed.ok() ? std::string("formed")
                         : std::string(formed.status().message()));
  if (!formed.ok()) return formed.status();
  out.formation = *std::move(formed);
  if (elastic) {
    // The reducer's client goes at the first re-formation; the round
    // and the elastic namespace are held by clients of their own.
    for (const std::string& round :
         {options.prefix, ReformationPrefix(options.prefix)}) {
      absl::StatusOr<std::unique_ptr<RendezvousStoreInterface>> holder =
          selector->Connect(coordinator, options.formation_timeout);
      if (!holder.ok()) continue;  // the job TTL removes the keys
      (*holder)->ReleaseRoundWhenDone(job_id, round, options.node_id,
                                      out.formation.layout.num_nodes);
      out.releases.push_back(*std::move(holder));
    }
  } else {
    client->ReleaseRoundWhenDone(job_id, options.prefix, options.node_id,
                                 out.formation.layout.num_nodes);
  }
  out.store = std::move(client);
  out.coordinator = coordinator;
  out.round_prefix = options.prefix;
  return out;
}

}  // namespace gradd
