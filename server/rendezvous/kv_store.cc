#include "server/rendezvous/kv_store.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradd {

absl::Status KvStore::CheckKey(absl::string_view job_id,
                               absl::string_view key) const {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("rendezvous: empty job id");
  }
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous: empty key in job '", job_id, "'"));
  }
  if (key.size() > options_.max_key_bytes ||
      job_id.size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous: key or job id longer than ", options_.max_key_bytes,
        " bytes in job '", job_id.substr(0, 64), "'"));
  }
  return absl::OkStatus();
}

bool KvStore::AllPresent(absl::string_view job_id,
                         absl::Span<const std::string> keys) const {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return keys.empty();
  for (const std::string& key : keys) {
    if (!job->second.contains(key)) return false;
  }
  return true;
}

absl::Status KvStore::BlockUntilPresent(absl::string_view job_id,
                                        absl::Span<const std::string> keys,
                                        absl::Time deadline,
                                        const CancelledFn& cancelled) {
  if (AllPresent(job_id, keys)) return absl::OkStatus();
  if (shutdown_) {
    return absl::UnavailableError("rendezvous store is shutting down");
  }
  if (waiters_ >= options_.max_waiters) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: more than ", options_.max_waiters,
                     " concurrent blocking calls"));
  }
  ++waiters_;
  absl::Status status = absl::OkStatus();
  while (!AllPresent(job_id, keys)) {
    if (shutdown_) {
      status = absl::UnavailableError("rendezvous store is shutting down");
      break;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      status = absl::DeadlineExceededError("deadline passed");
      break;
    }
    if (cancelled && cancelled()) {
      status = absl::CancelledError("caller went away");
      break;
    }
    absl::Time wake = deadline;
    if (cancelled) wake = std::min(wake, now + options_.cancel_poll);
    changed_.WaitWithDeadline(&mu_, wake);
  }
  --waiters_;
  return status;
}

absl::Status KvStore::Set(absl::string_view job_id, absl::string_view key,
                          absl::string_view value) {
  if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  if (value.size() > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: value of key '", key, "' in job '", job_id, "' is ",
        value.size(), " bytes, over the limit of ", options_.max_value_bytes));
  }
  absl::MutexLock lock(&mu_);
  jobs_[job_id].insert_or_assign(std::string(key), std::string(value));
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> KvStore::GetUntil(absl::string_view job_id,
                                              absl::string_view key,
                                              absl::Time deadline,
                                              const CancelledFn& cancelled) {
  if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  const std::string keys[] = {std::string(key)};
  absl::MutexLock lock(&mu_);
  absl::Status s = BlockUntilPresent(job_id, keys, deadline, cancelled);
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("rendezvous Get of key '", key, "' in job '",
                               job_id, "': ", s.message()));
  }
  return jobs_.find(job_id)->second.find(key)->second;
}

absl::StatusOr<std::string> KvStore::Get(absl::string_view job_id,
                                         absl::string_view key,
                                         absl::Duration timeout) {
  return GetUntil(job_id, key, absl::Now() + timeout);
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view job_id,
                                     absl::string_view key, int64_t delta) {
  if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::string& value = jobs_[job_id][key];
  int64_t current = 0;
  if (!value.empty() && !absl::SimpleAtoi(value, &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous Add: key '", key, "' in job '", job_id,
                     "' holds a value that is not a counter"));
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::OutOfRangeError(absl::StrCat(
        "rendezvous Add: counter '", key, "' in job '", job_id, "' overflows"));
  }
  current += delta;
  value = absl::StrCat(current);
  changed_.SignalAll();
  return current;
}

absl::Status KvStore::WaitUntil(absl::string_view job_id,
                                absl::Span<const std::string> keys,
                                absl::Time deadline,
                                const CancelledFn& cancelled) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("rendezvous: empty job id");
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = BlockUntilPresent(job_id, keys, deadline, cancelled);
  if (!s.ok()) {
    std::string missing;
    auto job = jobs_.find(job_id);
    int shown = 0;
    for (const std::string& key : keys) {
      if (job != jobs_.end() && job->second.contains(key)) continue;
      if (++shown > 8) {
        absl::StrAppend(&missing, ", ...");
        break;
      }
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", "'", key, "'");
    }
    return absl::Status(
        s.code(), absl::StrCat("rendezvous Wait in job '", job_id,
                               "': ", s.message(), "; missing ", missing));
  }
  return absl::OkStatus();
}

absl::Status KvStore::Wait(absl::string_view job_id,
                           absl::Span<const std::string> keys,
                           absl::Duration timeout) {
  return WaitUntil(job_id, keys, absl::Now() + timeout);
}

absl::StatusOr<bool> KvStore::Delete(absl::string_view job_id,
                                     absl::string_view key) {
  if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return false;
  const bool erased = job->second.erase(key) > 0;
  if (job->second.empty()) jobs_.erase(job);
  return erased;
}

void KvStore::DeleteJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

void KvStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

size_t KvStore::NumKeys(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  return job == jobs_.end() ? 0 : job->second.size();
}

}  // namespace gradd
