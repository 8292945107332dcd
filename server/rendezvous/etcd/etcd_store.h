// EtcdStore: the rendezvous store (RendezvousStoreInterface) on an etcd
// cluster, so that formation and re-formation need no coordinator daemon.
//
// Layout: every key of job J lives at
//   <prefix>jobs/<J escaped>/<key>
// where <prefix> is rendezvous.etcd.prefix (one per gradd cluster, ends in
// '/') and '%' and '/' of the job id are written %25 and %2F, so no job's
// keys can fall inside another's. Values are stored as they are; counters
// as decimal text, as the built-in store keeps them.
//
// Semantics are the built-in store's (server/rendezvous/kv_store.h):
//   - Set overwrites; Get and Wait block until the keys exist or the
//     timeout (DEADLINE_EXCEEDED naming the job, the keys and etcd), waiting
//     on a Watch (EtcdClient::WaitForKeys), not by polling;
//   - Add is atomic across daemons: a transaction that compares the key's
//     mod_revision with the one just read and puts the sum, retried with the
//     value etcd returns when another writer came first (INVALID_ARGUMENT
//     when the key holds no counter, OUT_OF_RANGE on overflow);
//   - Delete says whether the key existed;
//   - Release(job, round, node, n) records node `node` done with `round`;
//     the n-th distinct node's release deletes the round's keys except
//     "<round>/closed", as KvStore::Release does.
//   - Limits: max_key_bytes (job ids and keys, INVALID_ARGUMENT) and
//     max_value_bytes (RESOURCE_EXHAUSTED) are checked here; a value over
//     etcd's own request limit (--max-request-bytes, 1.5 MiB by default) is
//     RESOURCE_EXHAUSTED too. The per-job and total byte limits and the
//     round rate of the built-in store are not applied: etcd's quota
//     (--quota-backend-bytes) and its credentials bound what can be stored.
//
// What goes with the daemon: keys written by SetOwn (a node's liveness in a
// job, reformation.h) are attached to `lease` (the daemon's EtcdLease), so
// when the daemon vanishes they go one lease TTL after its last keep-alive;
// that is how the other nodes learn it is gone (HasLeases). Every other
// key (Set, Add, CompareAndSet: what the job's nodes share, which must
// outlive whichever node wrote it) is written without a lease and deleted
// when the job ends (Release, DeletePrefix, DeleteJob; the last node of an
// elastic job to leave deletes the job, job_manager_reformation.cc). Without a
// lease (null), SetOwn is Set.
//
// CompareAndSet is one etcd transaction (compare the key's value, or its
// absence, then put every key); DeletePrefix one DeleteRange.
//
// Thread-safety: every method may be called from any thread. The client and
// the lease are shared with the daemon's other stores.
#ifndef GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_STORE_H_
#define GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/rendezvous/etcd/etcd_client.h"
#include "server/rendezvous/etcd/etcd_lease.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

class EtcdStore : public RendezvousStoreInterface {
 public:
  struct Options {
    // Key prefix of this gradd cluster ("/gradd/" by default); a missing
    // trailing '/' is added.
    std::string prefix = "/gradd/";
    size_t max_key_bytes = 1024;
    size_t max_value_bytes = size_t{32} << 20;
    // How long one call may take when etcd does not answer (failover
    // included), so that a formation bounded by the formation timeout fails in
    // it, naming the endpoints; infinite: the client's retry_timeout.
    absl::Duration call_timeout = absl::InfiniteDuration();
  };

  EtcdStore(std::shared_ptr<EtcdClient> client,
            std::shared_ptr<EtcdLease> lease, Options options);

  [[nodiscard]] absl::Status Set(absl::string_view job_id,
                                 absl::string_view key,
                                 absl::string_view value) override;
  [[nodiscard]] absl::StatusOr<std::string> Get(
      absl::string_view job_id, absl::string_view key,
      absl::Duration timeout) override;
  [[nodiscard]] absl::StatusOr<int64_t> Add(absl::string_view job_id,
                                            absl::string_view key,
                                            int64_t delta) override;
  [[nodiscard]] absl::Status Wait(absl::string_view job_id,
                                  absl::Span<const std::string> keys,
                                  absl::Duration timeout) override;
  [[nodiscard]] absl::StatusOr<bool> Delete(absl::string_view job_id,
                                            absl::string_view key) override;
  // "etcd 10.0.0.1:2379,... (prefix /gradd/)".
  std::string Describe() const override;
  bool HasLeases() const override { return lease_ != nullptr; }
  [[nodiscard]] absl::Status SetOwn(absl::string_view job_id,
                                    absl::string_view key,
                                    absl::string_view value) override;
  [[nodiscard]] absl::StatusOr<bool> CompareAndSet(
      absl::string_view job_id, absl::string_view key,
      std::optional<std::string> expected, absl::string_view value,
      absl::Span<const std::pair<std::string, std::string>> also) override;
  [[nodiscard]] absl::StatusOr<int64_t> DeletePrefix(
      absl::string_view job_id, absl::string_view prefix) override;
  [[nodiscard]] absl::StatusOr<int64_t> CountPrefix(
      absl::string_view job_id, absl::string_view prefix) override;

  // As KvStore::Release (see the header comment).
  [[nodiscard]] absl::StatusOr<bool> Release(absl::string_view job_id,
                                             absl::string_view round,
                                             absl::string_view node_id,
                                             int num_nodes) override;
  // The release at destruction is bounded by 2 s (as a coordinator's), so
  // a job's end never waits for an etcd that does not answer.
  void ReleaseRoundWhenDone(std::string job_id, std::string round,
                            std::string node_id, int num_nodes) override;
  ~EtcdStore() override;
  // Deletes every key of `job_id`.
  [[nodiscard]] absl::Status DeleteJob(absl::string_view job_id);

  // The etcd key of `key` in `job_id` (tests, tools).
  std::string EtcdKey(absl::string_view job_id, absl::string_view key) const;
  // The prefix of every key of `job_id`.
  std::string JobPrefix(absl::string_view job_id) const;

 private:
  absl::Status CheckKey(absl::string_view job_id, absl::string_view key) const;
  // Puts `etcd_key` = `value`; `own`: under the lease (granting a new
  // lease once when etcd no longer knows the old one).
  absl::Status Put(absl::string_view etcd_key, absl::string_view value,
                   bool own);
  // How many keys start with `etcd_prefix` (a full etcd key prefix).
  absl::StatusOr<int64_t> CountUnder(const std::string& etcd_prefix);
  // The deadline of one etcd call made now (Options::call_timeout).
  absl::Time CallDeadline() const;
  // The lease id to attach to writes, 0 without a lease.
  absl::StatusOr<int64_t> LeaseId();
  // Etcd's refusal of a value it finds too large, as RESOURCE_EXHAUSTED.
  absl::Status MapWriteError(absl::Status status, absl::string_view job_id,
                             absl::string_view key) const;

  const std::shared_ptr<EtcdClient> client_;
  const std::shared_ptr<EtcdLease> lease_;
  const Options options_;
  // Options::call_timeout; the destructor's release bounds it shorter.
  absl::Duration call_timeout_;
  struct PendingRelease {
    std::string job_id;
    std::string round;
    std::string node_id;
    int num_nodes = 0;
  };
  std::optional<PendingRelease> release_when_done_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_STORE_H_
