#include "server/rendezvous/etcd/etcd_lease.h"

#include <utility>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace gradd {

absl::StatusOr<std::unique_ptr<EtcdLease>> EtcdLease::Create(
    std::shared_ptr<EtcdClient> client, absl::Duration ttl) {
  ttl = std::max(absl::Ceil(ttl, absl::Seconds(1)), absl::Seconds(2));
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> granted =
      client->LeaseGrant(ttl);
  if (!granted.ok()) return granted.status();
  return std::unique_ptr<EtcdLease>(
      new EtcdLease(std::move(client), ttl, granted->id()));
}

EtcdLease::EtcdLease(std::shared_ptr<EtcdClient> client, absl::Duration ttl,
                     int64_t id)
    : client_(std::move(client)), ttl_(ttl), id_(id) {
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
}

int64_t EtcdLease::current_id() const {
  absl::MutexLock lock(&mu_);
  return lost_ ? 0 : id_;
}

void EtcdLease::MarkLost(int64_t id) {
  absl::MutexLock lock(&mu_);
  if (id == id_) lost_ = true;
}

absl::StatusOr<int64_t> EtcdLease::Id() {
  {
    absl::MutexLock lock(&mu_);
    if (!lost_) return id_;
  }
  absl::StatusOr<etcdserverpb::LeaseGrantResponse> granted =
      client_->LeaseGrant(ttl_);
  if (!granted.ok()) return granted.status();
  absl::MutexLock lock(&mu_);
  if (lost_) {
    spdlog::warn("{}: lease {:x} was lost; keys now go under lease {:x}",
                 client_->Describe(), id_, granted->id());
    id_ = granted->id();
    lost_ = false;
  }
  return id_;
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
    if (!ttl.ok()) {
      spdlog::warn("etcd lease {:x}: keep-alive failed: {}", id,
                   ttl.status().ToString());
    } else if (*ttl <= 0 && id == id_) {
      spdlog::warn("{}: lease {:x} expired", client_->Describe(), id);
      lost_ = true;
    }
  }
}

}  // namespace gradd
