#include "server/engine/job/published_state.h"

#include <utility>

namespace gradd {

PublishedState::Layout PublishedState::layout() const {
  absl::MutexLock lock(&mu_);
  return layout_;
}

int PublishedState::world_size() const {
  absl::MutexLock lock(&mu_);
  return layout_.world_size;
}

void PublishedState::SetLayout(Layout layout) {
  absl::MutexLock lock(&mu_);
  layout_ = std::move(layout);
}

JobPhase PublishedState::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

void PublishedState::SetPhase(JobPhase phase) {
  absl::MutexLock lock(&mu_);
  phase_ = phase;
}

std::shared_ptr<const BucketPlan> PublishedState::plan() const {
  absl::MutexLock lock(&mu_);
  return plan_;
}

void PublishedState::PublishPlan(std::shared_ptr<const BucketPlan> plan) {
  absl::MutexLock lock(&mu_);
  plan_ = std::move(plan);
}

void PublishedState::RecordUnused(uint64_t iteration,
                                  std::vector<int32_t> unused) {
  absl::MutexLock lock(&mu_);
  if (iteration < unused_iteration_) return;  // completions out of order
  unused_iteration_ = iteration;
  ever_unused_ |= !unused.empty();
  unused_ = std::move(unused);
}

PublishedState::UsedMap PublishedState::used_map(bool with_params) const {
  UsedMap m;
  absl::MutexLock lock(&mu_);
  m.iteration = unused_iteration_;
  m.ever_unused = ever_unused_;
  if (with_params) m.unused = unused_;
  return m;
}

}  // namespace gradd
