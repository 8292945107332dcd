#include "server/admin/rendezvous_view.h"

namespace gradd {
namespace {

int64_t UnixNanosOrZero(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixNanos(t);
}

}  // namespace

v1::RendezvousStatus RendezvousStatusOf(const RendezvousFacts& facts,
                                        absl::Time now) {
  v1::RendezvousStatus r;
  r.set_backend(facts.backend);
  r.set_coordinator_address(facts.coordinator_address);
  r.set_port(facts.port);
  r.set_serving_address(facts.serving_address);
  for (const std::string& e : facts.etcd_endpoints) r.add_etcd_endpoints(e);
  r.set_etcd_security(facts.etcd_security);
  r.set_etcd_prefix(facts.etcd_prefix);
  if (facts.lease.has_value()) {
    const EtcdLeaseInfo& l = *facts.lease;
    v1::EtcdLeaseStatus* s = r.mutable_lease();
    s->set_id(l.id);
    s->set_held(l.held);
    s->set_ttl_ms(absl::ToInt64Milliseconds(l.ttl));
    s->set_granted_unix_ns(UnixNanosOrZero(l.granted));
    s->set_last_kept_alive_unix_ns(UnixNanosOrZero(l.last_kept_alive));
    if (l.last_kept_alive != absl::InfinitePast()) {
      s->set_last_kept_alive_age_ns(
          absl::ToInt64Nanoseconds(now - l.last_kept_alive));
    }
    s->set_grants(l.grants);
    s->set_losses(l.losses);
    s->set_failed_keepalives(l.failed_keepalives);
    s->set_last_error(l.last_error);
    s->set_lost_reason(l.lost_reason);
  }
  return r;
}

}  // namespace gradd
