#include "server/engine/manager/node_epochs.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {

NodeEpochs::NodeEpochs(std::vector<JobNode> members, int node_rank,
                       int max_nodes, int64_t arrivals_seen, uint64_t epoch)
    : members_(std::move(members)),
      node_rank_(node_rank),
      max_nodes_(max_nodes),
      epoch_(epoch) {
  next_arrival_->store(arrivals_seen + 1);
}

bool NodeEpochs::BreaksFor(int64_t n) const {
  return !reforming_ && n >= next_arrival_->load();
}

absl::Status NodeEpochs::Adopt(const std::string& job_id,
                               const JobLayout& layout, uint64_t epoch,
                               uint64_t max_completed, int64_t arrivals_seen,
                               const std::string& cause) {
  reforming_ = false;
  if (stall_.Observe(max_completed)) {
    return absl::AbortedError(absl::StrCat(
        "job '", job_id, "': the nodes' group re-formed ", stall_.in_a_row(),
        " times in a row without completing an iteration (the last completed "
        "is ",
        max_completed, "); last cause: ", cause, "; giving up"));
  }
  members_ = layout.nodes;
  node_rank_ = layout.node_rank;
  epoch_ = epoch;
  next_arrival_->store(
      std::max<int64_t>(next_arrival_->load(), arrivals_seen + 1));
  reformations_->fetch_add(1);
  return absl::OkStatus();
}

}  // namespace gradd
