#include "server/rendezvous/gloo_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"

namespace gradd {
namespace {

[[noreturn]] void ThrowForGloo(const absl::Status& status) {
  // Gloo's Store interface has no other error channel.
  throw gloo::IoException(status.ToString());
}

}  // namespace

GlooStore::GlooStore(RendezvousStoreInterface* store, std::string job_id,
                     std::string prefix,
                     std::chrono::milliseconds default_timeout)
    : store_(store),
      job_id_(std::move(job_id)),
      prefix_(std::move(prefix)),
      default_timeout_(default_timeout) {}

std::string GlooStore::FullKey(const std::string& key) const {
  return absl::StrCat(prefix_, "/", key);
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Set(
      job_id_, FullKey(key), absl::string_view(data.data(), data.size()));
  if (!status.ok()) ThrowForGloo(status);
  absl::MutexLock lock(&mu_);
  seen_.insert_or_assign(key, data);
}

std::vector<char> GlooStore::get(const std::string& key) {
  absl::StatusOr<std::string> value =
      store_->Get(job_id_, FullKey(key), absl::FromChrono(default_timeout_));
  if (!value.ok()) ThrowForGloo(value.status());
  std::vector<char> data(value->begin(), value->end());
  absl::MutexLock lock(&mu_);
  seen_.insert_or_assign(key, data);
  return data;
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, default_timeout_);
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& key : keys) full.push_back(FullKey(key));
  // Gloo passes kNoTimeout (zero) to mean "the default".
  const std::chrono::milliseconds effective =
      timeout.count() > 0 ? timeout : default_timeout_;
  absl::Status status =
      store_->Wait(job_id_, full, absl::FromChrono(effective));
  if (!status.ok()) ThrowForGloo(status);
}

std::optional<std::vector<char>> GlooStore::Published(
    const std::string& key) const {
  absl::MutexLock lock(&mu_);
  auto it = seen_.find(key);
  if (it == seen_.end()) return std::nullopt;
  return it->second;
}

}  // namespace gradd
