// The launcher's environment (torchrun's variables; gradd's own GRADD_*
// first) as ClientOptions, and the check that the job the daemons formed is
// the one the launcher started, so a multi-node launch can never run as
// several single-node jobs without saying so.
//
// What ClientOptions leaves unset is taken from, in order:
//   local_rank        LOCAL_RANK                               (else 0)
//   local_world_size  LOCAL_WORLD_SIZE                         (else 1)
//   num_nodes         GRADD_NUM_NODES, GROUP_WORLD_SIZE,
//                     WORLD_SIZE / local_world_size, NNODES    (else 1)
//   node_rank         GRADD_NODE_RANK, GROUP_RANK, NODE_RANK   (multi-node)
//   world_size, rank  WORLD_SIZE, RANK  (only checked against the daemons')
//   node_id           GRADD_NODE_ID
//   coordinator       GRADD_COORDINATOR, else MASTER_ADDR: a host, never
//                     MASTER_PORT (torch's store); the daemons add their
//                     rendezvous port (server/rendezvous/coordinator.h).
//
// Plain functions; thread-safe as far as `env` is.
#ifndef GRADD_CLIENT_SRC_SESSION_LAUNCHER_ENV_H_
#define GRADD_CLIENT_SRC_SESSION_LAUNCHER_ENV_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gradd/client.h"

namespace gradd::internal {

// Returns the variable's value, "" when unset.
using EnvLookup = std::function<std::string(const char* name)>;
// std::getenv.
std::string ProcessEnv(const char* name);

// INVALID_ARGUMENT naming the variable for a value that is not an integer,
// and naming both numbers when the variables contradict each other
// (WORLD_SIZE not a multiple of LOCAL_WORLD_SIZE, GROUP_WORLD_SIZE x
// LOCAL_WORLD_SIZE != WORLD_SIZE).
absl::Status ApplyLauncherEnv(ClientOptions* options, const EnvLookup& env);

// After the attach: FAILED_PRECONDITION naming both numbers when the
// daemons formed a job of another world size than options.world_size, or
// placed this trainer at another global rank than options.rank.
absl::Status CheckFormedWorld(const ClientOptions& options, int world_size,
                              int global_rank);

}  // namespace gradd::internal

#endif  // GRADD_CLIENT_SRC_SESSION_LAUNCHER_ENV_H_
