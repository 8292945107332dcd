#include "server/engine/manager/rank_restart_deadlines.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {

RankRestartDeadlines::RankRestartDeadlines(std::string job_id,
                                           int local_world_size,
                                           absl::Duration grace)
    : job_id_(std::move(job_id)),
      grace_(std::max(grace, absl::ZeroDuration())),
      deadlines_(std::max(local_world_size, 0), absl::InfiniteFuture()) {}

bool RankRestartDeadlines::away(int rank) const {
  return deadline(rank) != absl::InfiniteFuture();
}

absl::Time RankRestartDeadlines::deadline(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(deadlines_.size())) {
    return absl::InfiniteFuture();
  }
  return deadlines_[rank];
}

std::vector<int> RankRestartDeadlines::AwayRanks() const {
  std::vector<int> ranks;
  for (int r = 0; r < static_cast<int>(deadlines_.size()); ++r) {
    if (away(r)) ranks.push_back(r);
  }
  return ranks;
}

absl::Time RankRestartDeadlines::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (absl::Time t : deadlines_) next = std::min(next, t);
  return next;
}

absl::Time RankRestartDeadlines::Away(int rank, absl::Time now) {
  if (!has_grace() || rank < 0 || rank >= static_cast<int>(deadlines_.size())) {
    return absl::InfiniteFuture();
  }
  deadlines_[rank] = now + grace_;
  return deadlines_[rank];
}

void RankRestartDeadlines::Clear(int rank) {
  if (rank < 0 || rank >= static_cast<int>(deadlines_.size())) return;
  deadlines_[rank] = absl::InfiniteFuture();
}

std::optional<RankRestartDeadlines::Expiry> RankRestartDeadlines::Expire(
    absl::Time now) {
  int first = -1;
  for (int r = 0; r < static_cast<int>(deadlines_.size()); ++r) {
    if (deadlines_[r] <= now) {
      first = r;
      break;
    }
  }
  if (first < 0) return std::nullopt;
  Expiry expiry;
  expiry.status = absl::AbortedError(absl::StrCat(
      "local rank ", first, " of job '", job_id_,
      "' did not re-attach within rank_restart_grace_ms=", grace_ms(),
      " after its process went away"));
  // The job waits for nobody now: every rank still away is gone.
  expiry.gone = AwayRanks();
  for (int r : expiry.gone) Clear(r);
  return expiry;
}

}  // namespace gradd
