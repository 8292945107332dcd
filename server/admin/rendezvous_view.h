// What the admin API (GetStatus.rendezvous, `graddctl status`) says of the
// rendezvous backend and, on etcd, of this daemon's lease: admin.proto's
// RendezvousStatus built from plain facts the daemon gathers from its
// coordinator selector, etcd client and lease (server/daemon.cc), so tests
// build it without either.
//
// Never a credential: the facts hold endpoints, the kind of security and
// the user name, nothing else of rendezvous.etcd. Pure functions; any
// thread.
#ifndef GRADD_SERVER_ADMIN_RENDEZVOUS_VIEW_H_
#define GRADD_SERVER_ADMIN_RENDEZVOUS_VIEW_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gradd/v1/admin.pb.h"
#include "server/rendezvous/etcd/etcd_lease.h"

namespace gradd {

struct RendezvousFacts {
  // "builtin" or "etcd" (rendezvous.backend with its default applied).
  std::string backend;
  // builtin: the configured coordinator ("" : named per job), the port of
  // discovered coordinators, and where this daemon serves the store ("").
  std::string coordinator_address;
  uint32_t port = 0;
  std::string serving_address;
  // etcd: EtcdClient::endpoints(), SecurityDescription(), the key prefix
  // and the lease's Info() (none before it was granted).
  std::vector<std::string> etcd_endpoints;
  std::string etcd_security;
  std::string etcd_prefix;
  std::optional<EtcdLeaseInfo> lease;
};

// `now`: when the answer is made (the lease's age is measured from it).
v1::RendezvousStatus RendezvousStatusOf(const RendezvousFacts& facts,
                                        absl::Time now);

}  // namespace gradd

#endif  // GRADD_SERVER_ADMIN_RENDEZVOUS_VIEW_H_
