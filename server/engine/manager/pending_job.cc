#include "server/engine/manager/pending_job.h"

#include <algorithm>

namespace gradd {

bool PendingJob::Add(int r, PendingRank attach) {
  ranks_[r] = std::move(attach);
  ++count_;
  return complete();
}

std::optional<PendingRank> PendingJob::Take(int r) {
  std::optional<PendingRank> out = std::move(ranks_[r]);
  ranks_[r].reset();
  if (out) --count_;
  return out;
}

std::vector<int> PendingJob::Missing() const {
  std::vector<int> missing;
  for (int r = 0; r < world(); ++r) {
    if (!ranks_[r]) missing.push_back(r);
  }
  return missing;
}

std::vector<std::pair<int, PendingRank>> PendingJob::TakeExpired(
    absl::Time now) {
  std::vector<std::pair<int, PendingRank>> expired;
  if (forming()) return expired;
  for (int r = 0; r < world(); ++r) {
    if (ranks_[r] && ranks_[r]->deadline <= now) {
      expired.emplace_back(r, *Take(r));
    }
  }
  return expired;
}

absl::Time PendingJob::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  if (forming()) return next;
  for (const std::optional<PendingRank>& r : ranks_) {
    if (r) next = std::min(next, r->deadline);
  }
  return next;
}

std::vector<PendingRank> PendingJob::TakeAll() {
  std::vector<PendingRank> all;
  for (int r = 0; r < world(); ++r) {
    if (std::optional<PendingRank> attach = Take(r)) {
      all.push_back(*std::move(attach));
    }
  }
  return all;
}

}  // namespace gradd
