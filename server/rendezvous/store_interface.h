// The rendezvous key-value store as the rest of the daemon sees it: the
// in-process KvStore (the coordinator's own store, and tests), the gRPC
// RendezvousClient (every other daemon on the built-in backend) and the
// EtcdStore (rendezvous.backend: etcd) all implement it, so GlooStore,
// formation and re-formation run on any; CoordinatorSelector::Connect hands
// out the daemon's.
//
// Every key belongs to one job's namespace (`job_id`, non-empty); jobs never
// see each other's keys. Implementations are thread-safe.
//
// Errors: INVALID_ARGUMENT (empty job id or key, malformed counter),
// DEADLINE_EXCEEDED (a blocking call's timeout passed), UNAVAILABLE (the
// coordinator cannot be reached / is shutting down), RESOURCE_EXHAUSTED (too
// many concurrent waiters or too large a value).
#ifndef GRADD_SERVER_RENDEZVOUS_STORE_INTERFACE_H_
#define GRADD_SERVER_RENDEZVOUS_STORE_INTERFACE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace gradd {

class RendezvousStoreInterface {
 public:
  virtual ~RendezvousStoreInterface() = default;

  // Creates or overwrites `key`; wakes everyone waiting for it.
  [[nodiscard]] virtual absl::Status Set(absl::string_view job_id,
                                         absl::string_view key,
                                         absl::string_view value) = 0;
  // The value of `key`, waiting up to `timeout` for it to be set.
  [[nodiscard]] virtual absl::StatusOr<std::string> Get(
      absl::string_view job_id, absl::string_view key,
      absl::Duration timeout) = 0;
  // Atomically adds `delta` to the counter `key` (missing = 0) and returns
  // the new value. The counter is stored as decimal text, so Get sees it.
  // Add(key, 0) is a read: a store may leave a missing counter missing
  // (etcd does, so that probes leave no keys behind).
  [[nodiscard]] virtual absl::StatusOr<int64_t> Add(absl::string_view job_id,
                                                    absl::string_view key,
                                                    int64_t delta) = 0;
  // Waits up to `timeout` until every key in `keys` exists.
  [[nodiscard]] virtual absl::Status Wait(absl::string_view job_id,
                                          absl::Span<const std::string> keys,
                                          absl::Duration timeout) = 0;
  // Removes `key`; returns whether it existed.
  [[nodiscard]] virtual absl::StatusOr<bool> Delete(absl::string_view job_id,
                                                    absl::string_view key) = 0;
  // Where the store lives, for error messages ("coordinator 10.0.0.1:29400").
  virtual std::string Describe() const = 0;

  // What a store with leases and transactions (etcd) adds. The built-in
  // store has neither: its defaults say so, and re-formation then uses its
  // own agreement (server/engine/formation/reformation.h).

  // Whether keys written by SetOwn live only as long as this daemon (its
  // etcd lease): a daemon that vanishes takes them with it, one lease TTL
  // after its last keep-alive.
  virtual bool HasLeases() const { return false; }
  // A key of this daemon's own (its liveness in a job): under its lease
  // where the store has leases (HasLeases), else a plain Set.
  [[nodiscard]] virtual absl::Status SetOwn(absl::string_view job_id,
                                            absl::string_view key,
                                            absl::string_view value) {
    return Set(job_id, key, value);
  }
  // Compare-and-swap, in one transaction: when `key` holds `expected`
  // (nullopt: `key` does not exist), sets `key` to `value` and every
  // (key, value) of `also`, and returns true; otherwise changes nothing and
  // returns false. UNIMPLEMENTED where the store has no transactions.
  [[nodiscard]] virtual absl::StatusOr<bool> CompareAndSet(
      absl::string_view job_id, absl::string_view key,
      std::optional<std::string> expected, absl::string_view value,
      absl::Span<const std::pair<std::string, std::string>> also) {
    (void)job_id, (void)key, (void)expected, (void)value, (void)also;
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " has no transactions"));
  }
  // Deletes every key of `job_id` that starts with `prefix` (empty: every
  // key of the job), in one step; returns how many there were.
  // UNIMPLEMENTED where the store cannot.
  [[nodiscard]] virtual absl::StatusOr<int64_t> DeletePrefix(
      absl::string_view job_id, absl::string_view prefix) {
    (void)job_id, (void)prefix;
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " cannot delete by prefix"));
  }
  // Node `node_id` is done with `round` (a first key segment, no '/') of
  // `job_id`, a job of `num_nodes` nodes: once that many distinct nodes
  // have said so, the store deletes the round's keys but its "closed" mark
  // (KvStore::Release has the details). Returns whether this call deleted
  // them. UNIMPLEMENTED where the store keeps no rounds.
  [[nodiscard]] virtual absl::StatusOr<bool> Release(absl::string_view job_id,
                                                     absl::string_view round,
                                                     absl::string_view node_id,
                                                     int num_nodes) {
    (void)job_id, (void)round, (void)node_id, (void)num_nodes;
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " keeps no formation rounds"));
  }
  // Makes this store object Release(...) when it is destroyed (best effort,
  // within a couple of seconds, logged at debug level when it fails): a
  // formed job keeps a store object exactly as long as it runs on this
  // node, so the store learns when the job ended here. Ignored by stores
  // without rounds.
  virtual void ReleaseRoundWhenDone(std::string job_id, std::string round,
                                    std::string node_id, int num_nodes) {
    (void)job_id, (void)round, (void)node_id, (void)num_nodes;
  }
  // How many keys of `job_id` start with `prefix` (non-empty).
  // UNIMPLEMENTED where the store cannot count them.
  [[nodiscard]] virtual absl::StatusOr<int64_t> CountPrefix(
      absl::string_view job_id, absl::string_view prefix) {
    (void)job_id, (void)prefix;
    return absl::UnimplementedError(
        absl::StrCat(Describe(), " cannot count by prefix"));
  }
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_STORE_INTERFACE_H_
