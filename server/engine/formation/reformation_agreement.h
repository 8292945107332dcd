// Internal to formation/ (reformation*.cc): how the nodes entering an epoch
// agree on its members (reformation.h).
//
// Two agreements, chosen by the store:
//   - the built-in store (no leases, no transactions): a closer, the
//     survivor whose Add on "closed" returned 1, waits for the expected
//     entrants (the previous epoch's nodes, by their beats, and the
//     announced arrivals) or the settle, closes the epoch with a bias on
//     "joined" (later entrants see they are too late), decides and
//     publishes "members"; the older epoch's keys go but "joined", a
//     tombstone;
//   - a store with leases and transactions (etcd): every survivor waits the
//     same way, but a node of the previous epoch is lost as soon as its
//     liveness key ("alive/<node_id>", written with SetOwn under its
//     daemon's lease) is gone, and whichever survivor is done first decides:
//     one compare-and-swap moves the job's epoch key from e - 1 to e and
//     writes "members" with it. No node is special, nothing beats, and no
//     tombstone is needed: a late decider's swap fails, and a node the
//     verdict does not name came too late (it asks to be admitted into the
//     next epoch). The older epoch's keys go by prefix.
#ifndef GRADD_SERVER_ENGINE_FORMATION_REFORMATION_AGREEMENT_H_
#define GRADD_SERVER_ENGINE_FORMATION_REFORMATION_AGREEMENT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gradd/v1/rendezvous.pb.h"
#include "server/engine/formation/reformation.h"
#include "server/engine/formation/reformation_keys.h"
#include "server/rendezvous/store_interface.h"

namespace gradd::reformation_internal {

// The built-in store's closer: wait, close, decide, publish.
absl::StatusOr<v1::ElasticMembers> CloseEpoch(RendezvousStoreInterface& store,
                                              const ReformOptions& o,
                                              const EpochKeys& keys,
                                              absl::Time entered,
                                              absl::Time deadline);
// Every other entrant of the built-in store: the closer's verdict.
absl::StatusOr<v1::ElasticMembers> AwaitVerdict(RendezvousStoreInterface& store,
                                                const ReformOptions& o,
                                                const EpochKeys& keys,
                                                absl::Time deadline);

// On a store with leases and transactions (HasLeases), every entrant: the
// verdict, decided by this node or another; nullopt when this node came
// too late for the epoch (the verdict does not name it, or a later epoch
// was decided already).
absl::StatusOr<std::optional<v1::ElasticMembers>> AgreeByTransaction(
    RendezvousStoreInterface& store, const ReformOptions& o,
    const EpochKeys& keys, absl::Time entered, absl::Time deadline);

// On a store with leases: ABORTED when the job's running mark is gone (it
// ended on every node and its last node deleted its keys, LeaveJob), so
// there is nothing left to agree on and nothing may be written.
absl::Status StillRunning(RendezvousStoreInterface& store,
                          const ReformOptions& o);

// The last epoch decided (0: none yet).
absl::StatusOr<uint64_t> LastClosedEpoch(RendezvousStoreInterface& store,
                                         const std::string& job,
                                         const std::string& reformation_prefix);
// The verdict of `epoch` when it is still in the store (nullopt otherwise).
std::optional<v1::ElasticMembers> StoredVerdict(
    RendezvousStoreInterface& store, const std::string& job,
    const std::string& reformation_prefix, uint64_t epoch);

}  // namespace gradd::reformation_internal

#endif  // GRADD_SERVER_ENGINE_FORMATION_REFORMATION_AGREEMENT_H_
