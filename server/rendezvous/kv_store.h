// KvStore: the coordinator's in-memory, job-namespaced key-value store. The
// gRPC RendezvousService is a thin adapter over it; tests and the coordinator
// daemon itself may call it directly.
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
  struct Options {
    // Calls allowed to block at once (Get/Wait). Below the gRPC server's
    // thread cap (RendezvousServer::Options::max_threads, 256) so blocked
    // waiters never take the threads Set/Add need to wake them.
    int max_waiters = 192;
    // Largest value accepted by Set.
    size_t max_value_bytes = 64 << 20;
    // Largest key accepted.
    size_t max_key_bytes = 4096;
    // How often a blocked call re-checks its `cancelled` callback.
    absl::Duration cancel_poll = absl::Milliseconds(100);
  };
  // Returns true when the caller has gone away (e.g. the RPC was cancelled).
  using CancelledFn = std::function<bool()>;

  KvStore() : KvStore(Options()) {}
  explicit KvStore(Options options) : options_(options) {}
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

  // Drops every key of `job_id` (when the job ends).
  void DeleteJob(absl::string_view job_id);
  // Wakes every blocked call with UNAVAILABLE and fails later blocking calls.
  void Shutdown();

  // Number of keys in `job_id`'s namespace (for tests and stats).
  size_t NumKeys(absl::string_view job_id) const;

 private:
  using Namespace = absl::flat_hash_map<std::string, std::string>;

  absl::Status CheckKey(absl::string_view job_id, absl::string_view key) const;
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
  absl::flat_hash_map<std::string, Namespace> jobs_ ABSL_GUARDED_BY(mu_);
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_KV_STORE_H_
