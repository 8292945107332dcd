// EtcdLease: one etcd lease kept alive by a thread of its own, the lease a
// daemon attaches the keys it writes to (EtcdStore), so that what a
// vanished daemon wrote goes when its lease expires.
//
// The keeper sends a keep-alive every ttl/3. When etcd says the lease is
// gone (it expired while etcd was unreachable from here, or was revoked),
// the next Id() call after that grants a fresh one, so writes go on with a
// live lease (keys written under the old one are gone with it, as with any
// expired lease). The destructor stops the keeper and revokes the lease
// (best effort, bounded by the client's retry timeout): a daemon that stops
// cleanly removes its keys at once.
//
// Observability (`graddctl status`, the gradd_etcd_lease_* metrics): Info()
// says which lease is held, since when etcd last confirmed it, how often it
// was granted and lost and why the last keep-alive failed; the observer
// given to Create() hears of every change (EtcdLeaseEvent) as it happens.
// "Held" means etcd confirmed the lease (granted it or answered a
// keep-alive with a TTL) less than one TTL ago and has not said it is gone:
// while etcd is unreachable the lease stays held until a TTL has passed
// since the last answer, since etcd itself keeps it that long.
//
// Thread-safety: every method may be called from any thread; the keeper
// thread touches only the client and `mu_`-guarded state. The observer is
// called on the keeper thread or the thread that called Id(), MarkLost() or
// the destructor, one call at a time, with no lock of the lease held.
#ifndef GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_LEASE_H_
#define GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_LEASE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/rendezvous/etcd/etcd_client.h"

namespace gradd {

// What happened to a daemon's lease (EtcdLease's observer). The values are
// stable: metrics and logs name them (EtcdLeaseEventName).
enum class EtcdLeaseEvent : int {
  kGranted = 0,          // a lease was granted: the first, or one replacing
                         // a lost one (EtcdLeaseInfo::grants > 1)
  kKeptAlive = 1,        // etcd answered a keep-alive with a TTL
  kKeepAliveFailed = 2,  // a keep-alive got no answer (etcd unreachable)
  kLost = 3,             // etcd said the lease is gone (expired or revoked)
  kRevoked = 4,          // revoked by this daemon as it stops
};
// "granted", "kept_alive", "keepalive_failed", "lost", "revoked".
const char* EtcdLeaseEventName(EtcdLeaseEvent event);

// A snapshot of a daemon's lease (EtcdLease::Info).
struct EtcdLeaseInfo {
  // The lease keys go under, or the one last lost while no new one is
  // granted yet (held false); 0 before the first grant and after revoke.
  int64_t id = 0;
  // etcd confirmed `id` less than `ttl` ago and has not said it is gone.
  bool held = false;
  absl::Duration ttl;
  // When `id` was granted, and when etcd last confirmed it (the grant or
  // a keep-alive answered with a TTL).
  absl::Time granted = absl::InfinitePast();
  absl::Time last_kept_alive = absl::InfinitePast();
  // Leases granted (the first included; each one after it replaced a lost
  // one) and lost (etcd said expired, or refused a write as not found).
  uint64_t grants = 0;
  uint64_t losses = 0;
  // Keep-alives without an answer since the last answered one, and the
  // last one's error (EtcdClient's message: endpoints, never a credential;
  // empty once a keep-alive is answered).
  uint64_t failed_keepalives = 0;
  std::string last_error;
  // Why the lease is not held, when etcd said so ("expired", "refused a
  // write as not found", "revoked"); empty otherwise.
  std::string lost_reason;
};

class EtcdLease {
 public:
  // Told of every change of the lease, with the lease as it is after it.
  using Observer =
      std::function<void(EtcdLeaseEvent event, const EtcdLeaseInfo& info)>;

  // Grants the lease (errors as EtcdClient::LeaseGrant) and starts the
  // keeper. `ttl` is rounded up to whole seconds (etcd's unit), at least 2 s.
  // `observer` (may be null) hears kGranted for this first grant before
  // Create returns, then every later event.
  static absl::StatusOr<std::unique_ptr<EtcdLease>> Create(
      std::shared_ptr<EtcdClient> client, absl::Duration ttl,
      Observer observer = nullptr);
  ~EtcdLease();
  EtcdLease(const EtcdLease&) = delete;
  EtcdLease& operator=(const EtcdLease&) = delete;

  // The live lease's id, granting a new one first when etcd said the last
  // one is gone.
  [[nodiscard]] absl::StatusOr<int64_t> Id();
  // Tells the lease that etcd refused `id` as not found (a write with it
  // failed): the next Id() grants a new one.
  void MarkLost(int64_t id);
  absl::Duration ttl() const { return ttl_; }
  // The id now, 0 while none is held (for logs and status).
  int64_t current_id() const;
  // The lease as it is now (`held` as of now).
  EtcdLeaseInfo Info() const;

 private:
  EtcdLease(std::shared_ptr<EtcdClient> client, absl::Duration ttl, int64_t id,
            Observer observer);
  void Keep();
  EtcdLeaseInfo InfoLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the observer of `event` with the lease as it is when the
  // observer runs (so the last call always shows the latest state). Call
  // without mu_ held.
  void Notify(EtcdLeaseEvent event) ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<EtcdClient> client_;
  const absl::Duration ttl_;
  const Observer observer_;
  mutable absl::Mutex mu_;
  // Serialises the observer's calls; taken before mu_.
  absl::Mutex notify_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time granted_ ABSL_GUARDED_BY(mu_);
  absl::Time confirmed_ ABSL_GUARDED_BY(mu_);
  uint64_t grants_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t losses_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_keepalives_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  std::string lost_reason_ ABSL_GUARDED_BY(mu_);
  std::thread keeper_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_LEASE_H_
