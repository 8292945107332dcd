#include "client/src/session/launcher_env.h"

#include <cstdlib>
#include <initializer_list>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradd::internal {
namespace {

struct Found {
  const char* name = nullptr;
  int value = 0;
};

// The first of `names` that is set, parsed as an int; nullopt if none is.
absl::StatusOr<std::optional<Found>> First(
    const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const std::string v = env(name);
    if (v.empty()) continue;
    int out = 0;
    if (!absl::SimpleAtoi(v, &out)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "environment variable ", name, "='", v, "' is not an integer"));
    }
    return std::optional<Found>(Found{name, out});
  }
  return std::optional<Found>();
}

}  // namespace

std::string ProcessEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

absl::Status ApplyLauncherEnv(ClientOptions* o, const EnvLookup& env) {
  if (o->local_rank < 0) {
    ASSIGN_OR_RETURN(std::optional<Found> r, First(env, {"LOCAL_RANK"}));
    o->local_rank = r.has_value() ? r->value : 0;
  }
  const bool local_world_given = o->local_world_size > 0;
  if (!local_world_given) {
    ASSIGN_OR_RETURN(std::optional<Found> w, First(env, {"LOCAL_WORLD_SIZE"}));
    o->local_world_size = w.has_value() ? w->value : 1;
  }
  ASSIGN_OR_RETURN(std::optional<Found> world, First(env, {"WORLD_SIZE"}));
  if (o->world_size <= 0 && world.has_value()) o->world_size = world->value;
  if (!o->rank.has_value()) {
    ASSIGN_OR_RETURN(std::optional<Found> rank, First(env, {"RANK"}));
    if (rank.has_value()) o->rank = rank->value;
  }
  ASSIGN_OR_RETURN(std::optional<Found> groups,
                   First(env, {"GRADD_NUM_NODES", "GROUP_WORLD_SIZE"}));
  if (groups.has_value() && world.has_value() && o->local_world_size > 0 &&
      groups->value * o->local_world_size != world->value) {
    return absl::InvalidArgumentError(absl::StrCat(
        groups->name, "=", groups->value, " nodes x local world size ",
        o->local_world_size, " is not WORLD_SIZE=", world->value, " (job '",
        o->job_id, "')"));
  }
  if (o->num_nodes <= 0) {
    if (groups.has_value()) {
      o->num_nodes = groups->value;
    } else if (world.has_value() && o->local_world_size > 0) {
      if (world->value % o->local_world_size != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("WORLD_SIZE=", world->value,
                         " is not a multiple of the local "
                         "world size ",
                         o->local_world_size, " (job '", o->job_id, "')"));
      }
      o->num_nodes = world->value / o->local_world_size;
    } else {
      ASSIGN_OR_RETURN(std::optional<Found> n, First(env, {"NNODES"}));
      if (n.has_value()) o->num_nodes = n->value;
    }
  }
  // Launchers set node-rank variables for single-node runs too; they only
  // mean something to a job that spans nodes.
  if (!o->node_rank.has_value() && o->num_nodes > 1) {
    ASSIGN_OR_RETURN(
        std::optional<Found> r,
        First(env, {"GRADD_NODE_RANK", "GROUP_RANK", "NODE_RANK"}));
    if (r.has_value()) o->node_rank = r->value;
  }
  if (o->node_id.empty()) o->node_id = env("GRADD_NODE_ID");
  if (o->coordinator.empty()) o->coordinator = env("GRADD_COORDINATOR");
  if (o->coordinator.empty()) o->coordinator = env("MASTER_ADDR");
  return absl::OkStatus();
}

absl::Status CheckFormedWorld(const ClientOptions& o, int world_size,
                              int global_rank) {
  if (o.world_size > 0 && o.world_size != world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", o.job_id, "': the launcher says world size ", o.world_size,
        " (WORLD_SIZE / ClientOptions::world_size) but the daemons formed a "
        "job of world size ",
        world_size, " (", o.num_nodes > 0 ? o.num_nodes : 1,
        " node(s) x local world size ", o.local_world_size,
        "); set GROUP_WORLD_SIZE / GRADD_NUM_NODES to the number of nodes"));
  }
  if (o.rank.has_value() && *o.rank != global_rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", o.job_id, "': the launcher says rank ", *o.rank,
        " (RANK / ClientOptions::rank) but the daemons placed this trainer at "
        "global rank ",
        global_rank, " of ", world_size,
        "; node ranks come from GROUP_RANK / GRADD_NODE_RANK"));
  }
  return absl::OkStatus();
}

}  // namespace gradd::internal
