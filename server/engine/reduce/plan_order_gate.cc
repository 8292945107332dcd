#include "server/engine/reduce/plan_order_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gradd {

void PlanOrderGate::Arrive(uint64_t iteration, int bucket, Issue issue) {
  const int num_buckets = static_cast<int>(ordered_.size());
  if (bucket >= 0 && bucket < num_buckets && !ordered_[bucket]) {
    if (issue != nullptr) std::move(issue)(absl::OkStatus());
    return;
  }
  const std::pair<uint64_t, int> key(iteration, bucket);
  const std::pair<uint64_t, int> cursor(iteration_, bucket_);
  if (bucket < 0 || bucket >= num_buckets || key < cursor ||
      held_.count(key) > 0) {
    if (issue != nullptr) {
      std::move(issue)(absl::InternalError(
          absl::StrCat("bucket ", bucket, " of iteration ", iteration,
                       " cannot be put into plan order (next expected: bucket ",
                       bucket_, " of iteration ", iteration_, ", ", num_buckets,
                       " buckets per iteration)")));
    }
    return;
  }
  if (key != cursor) {
    held_.emplace(key, std::move(issue));
    return;
  }
  if (issue != nullptr) std::move(issue)(absl::OkStatus());
  Advance();
  while (!held_.empty() &&
         held_.begin()->first == std::make_pair(iteration_, bucket_)) {
    Issue next = std::move(held_.begin()->second);
    held_.erase(held_.begin());
    if (next != nullptr) std::move(next)(absl::OkStatus());
    Advance();
  }
}

void PlanOrderGate::Advance() {
  if (!any_ordered_) return;
  do {
    if (++bucket_ >= static_cast<int>(ordered_.size())) {
      bucket_ = 0;
      ++iteration_;
    }
  } while (!ordered_[bucket_]);
}

void PlanOrderGate::Reset(std::vector<bool> ordered, uint64_t first_iteration) {
  ordered_ = std::move(ordered);
  any_ordered_ =
      std::find(ordered_.begin(), ordered_.end(), true) != ordered_.end();
  iteration_ = first_iteration;
  bucket_ = 0;
  if (any_ordered_ && !ordered_[0]) Advance();
}

void PlanOrderGate::Replan(uint64_t first_iteration,
                           std::vector<bool> ordered) {
  Cancel(absl::InternalError("the plan changed while buckets were held"));
  Reset(std::move(ordered), first_iteration);
}

void PlanOrderGate::Cancel(const absl::Status& why) {
  std::map<std::pair<uint64_t, int>, Issue> held = std::move(held_);
  held_.clear();
  for (auto& [key, issue] : held) {
    if (issue != nullptr) std::move(issue)(why);
  }
}

}  // namespace gradd
