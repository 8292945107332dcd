#include "server/rendezvous/etcd/etcd_lease.h"

#include <utility>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace gradd {

const char* EtcdLeaseEventName(EtcdLeaseEvent event) {
  switch (event) {
    case EtcdLeaseEvent::kGranted:
      return "granted";
    case EtcdLeaseEvent::kKeptAlive:
      return "kept_alive";
    case EtcdLeaseEvent::kKeepAliveFailed:
      return "keepalive_failed";
    case EtcdLeaseEvent::kLost:
      return "lost";
    case EtcdLeaseEvent::kRevoked:
      return "revoked";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<EtcdLease>> EtcdLease::Create(
    std::shared_ptr<EtcdClient> client, absl::Duration ttl, Observer observer) {
  ttl = std::max(absl::Ceil(ttl, absl::Seconds(1)), absl::Seconds(2));
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> granted =
      client->LeaseGrant(ttl);
  if (!granted.ok()) return granted.status();
  std::unique_ptr<EtcdLease> lease(new EtcdLease(
      std::move(client), ttl, granted->id(), std::move(observer)));
  lease->Notify(EtcdLeaseEvent::kGranted);
  return lease;
}

EtcdLease::EtcdLease(std::shared_ptr<EtcdClient> client, absl::Duration ttl,
                     int64_t id, Observer observer)
    : client_(std::move(client)),
      ttl_(ttl),
      observer_(std::move(observer)),
      id_(id),
      granted_(absl::Now()),
      confirmed_(granted_) {
  keeper_ = std::thread([this] { Keep(); });
}

EtcdLease::~EtcdLease() {
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    id = lost_ ? 0 : id_;
  }
  keeper_.join();
  if (id != 0) {
    if (absl::Status revoked = client_->LeaseRevoke(id); !revoked.ok()) {
      spdlog::debug("etcd: revoking lease {:x}: {}", id, revoked.ToString());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    revoked_ = true;
  }
  Notify(EtcdLeaseEvent::kRevoked);
}

int64_t EtcdLease::current_id() const {
  absl::MutexLock lock(&mu_);
  return lost_ ? 0 : id_;
}

EtcdLeaseInfo EtcdLease::InfoLocked(absl::Time now) const {
  EtcdLeaseInfo info;
  info.id = revoked_ ? 0 : id_;
  info.ttl = ttl_;
  info.held = !revoked_ && !lost_ && now - confirmed_ < ttl_;
  info.granted = granted_;
  info.last_kept_alive = confirmed_;
  info.grants = grants_;
  info.losses = losses_;
  info.failed_keepalives = failed_keepalives_;
  info.last_error = last_error_;
  info.lost_reason = revoked_ ? "revoked" : lost_ ? lost_reason_ : "";
  return info;
}

EtcdLeaseInfo EtcdLease::Info() const {
  absl::MutexLock lock(&mu_);
  return InfoLocked(absl::Now());
}

void EtcdLease::Notify(EtcdLeaseEvent event) {
  if (!observer_) return;
  absl::MutexLock serial(&notify_mu_);
  const EtcdLeaseInfo info = Info();
  observer_(event, info);
}

void EtcdLease::MarkLost(int64_t id) {
  {
    absl::MutexLock lock(&mu_);
    if (id != id_ || lost_) return;
    lost_ = true;
    ++losses_;
    lost_reason_ = "etcd refused a write under it as not found";
  }
  Notify(EtcdLeaseEvent::kLost);
}

absl::StatusOr<int64_t> EtcdLease::Id() {
  {
    absl::MutexLock lock(&mu_);
    if (!lost_) return id_;
  }
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> granted =
      client_->LeaseGrant(ttl_);
  if (!granted.ok()) return granted.status();
  bool replaced = false;
  int64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (lost_) {
      spdlog::warn("{}: lease {:x} was lost; keys now go under lease {:x}",
                   client_->Describe(), id_, granted->id());
      id_ = granted->id();
      lost_ = false;
      lost_reason_.clear();
      granted_ = absl::Now();
      confirmed_ = granted_;
      failed_keepalives_ = 0;
      last_error_.clear();
      ++grants_;
      replaced = true;
    }
    id = id_;
  }
  // Another caller replaced it first: the lease just granted is not used
  // and expires by itself.
  if (replaced) Notify(EtcdLeaseEvent::kGranted);
  return id;
}

void EtcdLease::Keep() {
  const absl::Duration interval = ttl_ / 3;
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const absl::Time next = absl::Now() + interval;
    while (!stop_ && absl::Now() < next) {
      mu_.AwaitWithDeadline(absl::Condition(&stop_), next);
    }
    if (stop_) break;
    if (lost_) continue;  // Id() grants the next one when someone writes
    const int64_t id = id_;
    mu_.Unlock();
    absl::StatusOr<int64_t> ttl = client_->KeepAliveOnce(id);
    mu_.Lock();
    if (id != id_) continue;  // replaced meanwhile
    EtcdLeaseEvent event;
    if (!ttl.ok()) {
      ++failed_keepalives_;
      last_error_ = ttl.status().ToString();
      spdlog::warn(
          "etcd lease {:x}: keep-alive failed ({} in a row, last "
          "answer {} ago): {}",
          id, failed_keepalives_,
          absl::FormatDuration(
              absl::Trunc(absl::Now() - confirmed_, absl::Seconds(1))),
          last_error_);
      event = EtcdLeaseEvent::kKeepAliveFailed;
    } else if (*ttl <= 0) {
      spdlog::warn("{}: lease {:x} expired", client_->Describe(), id);
      lost_ = true;
      ++losses_;
      lost_reason_ = "etcd said it expired";
      event = EtcdLeaseEvent::kLost;
    } else {
      if (failed_keepalives_ > 0) {
        spdlog::info(
            "etcd lease {:x}: kept alive again after {} failed "
            "keep-alives ({} without an answer)",
            id, failed_keepalives_,
            absl::FormatDuration(
                absl::Trunc(absl::Now() - confirmed_, absl::Seconds(1))));
      }
      confirmed_ = absl::Now();
      failed_keepalives_ = 0;
      last_error_.clear();
      event = EtcdLeaseEvent::kKeptAlive;
    }
    mu_.Unlock();
    Notify(event);
    mu_.Lock();
  }
}

}  // namespace gradd
