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
// Thread-safety: every method may be called from any thread; the keeper
// thread touches only the client and `mu_`-guarded state.
#ifndef GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_LEASE_H_
#define GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_LEASE_H_

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/rendezvous/etcd/etcd_client.h"

namespace gradd {

class EtcdLease {
 public:
  // Grants the lease (errors as EtcdClient::LeaseGrant) and starts the
  // keeper. `ttl` is rounded up to whole seconds (etcd's unit), at least 2 s.
  static absl::StatusOr<std::unique_ptr<EtcdLease>> Create(
      std::shared_ptr<EtcdClient> client, absl::Duration ttl);
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

 private:
  EtcdLease(std::shared_ptr<EtcdClient> client, absl::Duration ttl, int64_t id);
  void Keep();

  const std::shared_ptr<EtcdClient> client_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  int64_t id_ ABSL_GUARDED_BY(mu_) = 0;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keeper_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_RENDEZVOUS_ETCD_ETCD_LEASE_H_
