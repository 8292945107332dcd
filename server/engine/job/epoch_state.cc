#include "server/engine/job/epoch_state.h"

#include <algorithm>
#include <utility>

namespace gradd {

std::string EpochState::Unsurvivable(bool join_in_play,
                                     bool plan_switch_pending) {
  if (join_in_play) return "a join (uneven inputs) is in play";
  if (plan_switch_pending) return "a bucket rebuild is pending";
  return std::string();
}

bool EpochState::Break(std::string reason, int64_t now_ns) {
  if (!enabled_ || stage_ != Stage::kRunning) return false;
  stage_ = Stage::kDraining;
  reason_ = std::move(reason);
  broke_ns_ = now_ns;
  return true;
}

bool EpochState::Drained(int in_flight) {
  if (stage_ != Stage::kDraining || in_flight != 0) return false;
  stage_ = Stage::kReforming;
  return true;
}

void EpochState::Resume() {
  if (stage_ == Stage::kReforming) stage_ = Stage::kRunning;
}

int64_t EpochState::ElapsedMs(int64_t now_ns) const {
  if (broke_ns_ == 0) return 0;
  return (now_ns - broke_ns_) / 1'000'000;
}

std::vector<std::string> EpochState::LostAfter(
    std::vector<std::string> lost_before, const Membership& m) {
  if (m.cause_known) return m.departed;
  for (const std::string& id : m.lost) {
    if (std::find(lost_before.begin(), lost_before.end(), id) ==
        lost_before.end()) {
      lost_before.push_back(id);
    }
  }
  for (const std::string& id : m.admitted) {
    lost_before.erase(std::remove(lost_before.begin(), lost_before.end(), id),
                      lost_before.end());
  }
  return lost_before;
}

bool EpochState::MembershipChanged(std::vector<std::string> node_ids,
                                   std::vector<std::string> initial_node_ids,
                                   int world_size, int initial_world_size) {
  std::sort(node_ids.begin(), node_ids.end());
  std::sort(initial_node_ids.begin(), initial_node_ids.end());
  return node_ids != initial_node_ids || world_size != initial_world_size;
}

}  // namespace gradd
