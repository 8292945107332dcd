// KvStore: the coordinator's in-memory, job-namespaced key-value store. The
// gRPC RendezvousService is a thin adapter over it; tests and the coordinator
// daemon itself may call it directly.
//
// Bounded (rendezvous.limits in the config): a key or job id over
// max_key_bytes is INVALID_ARGUMENT; a value over max_value_bytes, a job
// over max_keys_per_job keys or max_job_bytes bytes, all jobs together over
// max_total_bytes bytes, or a job starting more than max_rounds_per_minute
// formation rounds within a minute is RESOURCE_EXHAUSTED. Every refusal
// names the limit by its config key. Bytes count keys, values and a fixed
// overhead per key and per job, so the coordinator's memory is bounded by
// max_total_bytes (plus the requests in flight) whatever clients store.
//
// Formation rounds: keys with a '/' belong to the round named by their
// first segment ("round3/member/node-a" to "round3"; see
// server/rendezvous/job_formation.h and server/engine/node_formation.h).
// A round starts when its first key is created.
//
// Lifetime of a job's keys: Release(job, round, node, n) records that node
// `node` is done with `round` (its job ended there); once `n` distinct nodes
// have, the round's keys are deleted except "<round>/closed", the mark by
// which OpenRound (server/engine/node_formation.h) skips used rounds so that
// nodes re-forming the job meet in a fresh round. A job nobody has touched
// (any call naming it) for job_ttl is dropped whole - what happens to the
// keys of a job whose nodes never said they ended (a node died, the
// coordinator restarted them, a client left keys behind).
//
// Thread-safety: every method may be called from any thread. Blocking calls
// (Get, Wait) sleep on a condition variable until the keys exist, their
// deadline passes, `cancelled` returns true (checked every
// Options::cancel_poll), or Shutdown() is called. At most
// Options::max_waiters calls block at once; more get RESOURCE_EXHAUSTED, so a
// flood of waiters cannot exhaust the server's threads.
#ifndef GRADD_SERVER_RENDEZVOUS_KV_STORE_H_
#define GRADD_SERVER_RENDEZVOUS_KV_STORE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/rendezvous/store_interface.h"

namespace gradd {

class KvStore : public RendezvousStoreInterface {
 public:
  // Bytes charged per key and per job on top of their text (hash-table
  // entries, string headers), so that many tiny keys count too.
  static constexpr size_t kKeyOverheadBytes = 64;
  static constexpr size_t kJobOverheadBytes = 256;

  struct Options {
    // Calls allowed to block at once (Get/Wait). Below the gRPC server's
    // thread cap (RendezvousServer::Options::max_threads, 256) so blocked
    // waiters never take the threads Set/Add need to wake them.
    int max_waiters = 192;
    // The limits (rendezvous.limits.*; see config.proto for the defaults'
    // reasons). 0 turns max_rounds_per_minute off.
    size_t max_key_bytes = 1024;
    size_t max_value_bytes = size_t{32} << 20;
    size_t max_keys_per_job = 65536;
    size_t max_job_bytes = size_t{512} << 20;
    size_t max_total_bytes = size_t{1} << 30;
    int max_rounds_per_minute = 60;
    absl::Duration job_ttl = absl::Hours(24);
    // How often a blocked call re-checks its `cancelled` callback.
    absl::Duration cancel_poll = absl::Milliseconds(100);
    // The time the limits and the TTL are measured by (tests pass a fake);
    // null: absl::Now. Blocking waits always use real time.
    std::function<absl::Time()> clock;
  };
  // Returns true when the caller has gone away (e.g. the RPC was cancelled).
  using CancelledFn = std::function<bool()>;

  KvStore() : KvStore(Options()) {}
  explicit KvStore(Options options);
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  // Deadline-based forms used by the gRPC adapter.
  [[nodiscard]] absl::StatusOr<std::string> GetUntil(
      absl::string_view job_id, absl::string_view key, absl::Time deadline,
      const CancelledFn& cancelled = nullptr);
  [[nodiscard]] absl::Status WaitUntil(absl::string_view job_id,
                                       absl::Span<const std::string> keys,
                                       absl::Time deadline,
                                       const CancelledFn& cancelled = nullptr);

  // RendezvousStoreInterface.
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
  std::string Describe() const override { return "in-process store"; }

  // Node `node_id` is done with `round` of `job_id`, a job of `num_nodes`
  // nodes (see the header comment). Returns whether this release deleted
  // the round's keys. INVALID_ARGUMENT for an empty or over-long job id,
  // round or node id, a round with '/', or num_nodes outside 1..65536;
  // RESOURCE_EXHAUSTED as Set when the mark does not fit the limits.
  [[nodiscard]] absl::StatusOr<bool> Release(absl::string_view job_id,
                                             absl::string_view round,
                                             absl::string_view node_id,
                                             int num_nodes) override;

  // Drops every key of `job_id` (when the job ends).
  void DeleteJob(absl::string_view job_id);
  // Wakes every blocked call with UNAVAILABLE and fails later blocking calls.
  void Shutdown();

  // Number of keys in `job_id`'s namespace, bytes charged to it and to all
  // jobs (for tests and stats).
  size_t NumKeys(absl::string_view job_id) const;
  size_t JobBytes(absl::string_view job_id) const;
  size_t TotalBytes() const;
  size_t NumJobs() const;

 private:
  struct Job {
    absl::flat_hash_map<std::string, std::string> keys;
    size_t bytes = kJobOverheadBytes;
    absl::Time last_used;
    // Keys per formation round (first segment of keys with a '/').
    absl::flat_hash_map<std::string, size_t> rounds;
    // When each of the rounds started within the last minute, oldest first.
    std::deque<absl::Time> round_starts;
    // Distinct nodes that released each round.
    absl::flat_hash_map<std::string, int> released;
  };

  absl::Time Now() const;
  absl::Status CheckKey(absl::string_view job_id, absl::string_view key) const;
  // Creates or overwrites `key` after checking every limit (the job is
  // created if needed and dropped again if the write is refused).
  absl::Status PutLocked(absl::string_view job_id, absl::string_view key,
                         std::string value, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases `it` from `job`, keeping the accounting.
  void EraseLocked(Job& job,
                   absl::flat_hash_map<std::string, std::string>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJobLocked(absl::string_view job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `job_id` used now; drops jobs past their TTL (at most once per
  // sweep interval).
  void TouchLocked(absl::string_view job_id, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllPresent(absl::string_view job_id,
                  absl::Span<const std::string> keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks until AllPresent(keys), the deadline, cancellation or shutdown.
  absl::Status BlockUntilPresent(absl::string_view job_id,
                                 absl::Span<const std::string> keys,
                                 absl::Time deadline,
                                 const CancelledFn& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  size_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_sweep_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_KV_STORE_H_
