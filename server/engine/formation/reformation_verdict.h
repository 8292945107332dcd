// Internal to formation/ (reformation*.cc): the verdict of an epoch.
#ifndef GRADD_SERVER_ENGINE_FORMATION_REFORMATION_VERDICT_H_
#define GRADD_SERVER_ENGINE_FORMATION_REFORMATION_VERDICT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "gradd/v1/rendezvous.pb.h"
#include "server/engine/formation/reformation.h"

namespace gradd::reformation_internal {

// The verdict on `entrants` (reformation.h "members"), a pure function of
// what the deciding node read: the survivors in their old node-rank order,
// then the arrivals admitted by node id; kept and returning offsets; the
// departed carried from `before` (the previous epoch's verdict; none for
// epoch 1); max_completed, sync_seq, the initial world size, the cause and
// its line, and failed when fewer than min_nodes remain.
v1::ElasticMembers Decide(const ReformOptions& o,
                          const std::vector<v1::ElasticMember>& entrants,
                          int64_t arrivals_seen,
                          const std::optional<v1::ElasticMembers>& before);

}  // namespace gradd::reformation_internal

#endif  // GRADD_SERVER_ENGINE_FORMATION_REFORMATION_VERDICT_H_
