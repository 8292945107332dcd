#include "server/rendezvous/kv_store.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/rendezvous/store_checks.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

constexpr int kMaxReleaseNodes = 65536;
constexpr absl::Duration kRoundWindow = absl::Minutes(1);
constexpr absl::Duration kMaxSweepInterval = absl::Minutes(1);
constexpr absl::string_view kKeptInRound = "/closed";

// Client-chosen text in messages (store_checks.h).
std::string Shown(absl::string_view s) { return ShownInMessage(s); }

// The formation round a key belongs to: its first segment, for keys with a
// '/'; "" for others.
absl::string_view RoundOf(absl::string_view key) {
  const size_t slash = key.find('/');
  return slash == absl::string_view::npos ? absl::string_view()
                                          : key.substr(0, slash);
}

size_t EntryBytes(absl::string_view key, size_t value_bytes) {
  return key.size() + value_bytes + KvStore::kKeyOverheadBytes;
}

}  // namespace

KvStore::KvStore(Options options) : options_(std::move(options)) {}

absl::Time KvStore::Now() const {
  return options_.clock ? options_.clock() : absl::Now();
}

absl::Status KvStore::CheckKey(absl::string_view job_id,
                               absl::string_view key) const {
  return CheckStoreKey(job_id, key, options_.max_key_bytes);
}

void KvStore::TouchLocked(absl::string_view job_id, absl::Time now) {
  if (now >= next_sweep_) {
    next_sweep_ = now + std::clamp(options_.job_ttl / 8, absl::Seconds(1),
                                   kMaxSweepInterval);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      auto next = std::next(it);
      if (now - it->second.last_used >= options_.job_ttl) {
        spdlog::info(
            "rendezvous: dropping job '{}' ({} keys, {} bytes): untouched "
            "for {} (rendezvous.limits.job_ttl_s)",
            Shown(it->first), it->second.keys.size(), it->second.bytes,
            absl::FormatDuration(now - it->second.last_used));
        total_bytes_ -= it->second.bytes + it->first.size();
        jobs_.erase(it);
      }
      it = next;
    }
  }
  if (auto job = jobs_.find(job_id); job != jobs_.end()) {
    job->second.last_used = now;
  }
}

absl::Status KvStore::PutLocked(absl::string_view job_id, absl::string_view key,
                                std::string value, absl::Time now) {
  auto job_it = jobs_.find(job_id);
  const bool new_job = job_it == jobs_.end();
  const size_t job_overhead = kJobOverheadBytes + job_id.size();
  const size_t job_bytes = new_job ? kJobOverheadBytes : job_it->second.bytes;
  Job* job = new_job ? nullptr : &job_it->second;
  // The value being overwritten; null for a new key.
  std::string* existing = nullptr;
  if (job != nullptr) {
    if (auto it = job->keys.find(key); it != job->keys.end()) {
      existing = &it->second;
    }
  }
  const bool new_key = existing == nullptr;
  const absl::string_view round = RoundOf(key);
  const bool new_round =
      !round.empty() && (new_job || !job->rounds.contains(round));

  // What the write adds, in bytes (a shorter value frees some).
  const size_t old_bytes = new_key ? 0 : EntryBytes(key, existing->size());
  const size_t new_bytes = EntryBytes(key, value.size());
  const size_t added = new_bytes > old_bytes ? new_bytes - old_bytes : 0;
  const size_t added_total = added + (new_job ? job_overhead : 0);

  if (new_key) {
    const size_t keys = new_job ? 0 : job->keys.size();
    if (keys + 1 > options_.max_keys_per_job) {
      return absl::ResourceExhaustedError(
          absl::StrCat("rendezvous: job '", Shown(job_id), "' already holds ",
                       keys, " keys; key '", Shown(key),
                       "' is refused by rendezvous.limits.max_keys_per_job = ",
                       options_.max_keys_per_job));
    }
  }
  if (job_bytes + added > options_.max_job_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: job '", Shown(job_id), "' would hold ", job_bytes + added,
        " bytes with key '", Shown(key),
        "', over rendezvous.limits.max_job_bytes = ", options_.max_job_bytes));
  }
  if (total_bytes_ + added_total > options_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: the store would hold ", total_bytes_ + added_total,
        " bytes (all jobs) with key '", Shown(key), "' of job '", Shown(job_id),
        "', over rendezvous.limits.max_total_bytes = ",
        options_.max_total_bytes));
  }
  if (new_round && options_.max_rounds_per_minute > 0 && !new_job) {
    std::deque<absl::Time>& starts = job->round_starts;
    while (!starts.empty() && now - starts.front() >= kRoundWindow) {
      starts.pop_front();
    }
    if (starts.size() >= static_cast<size_t>(options_.max_rounds_per_minute)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rendezvous: job '", Shown(job_id), "' started ", starts.size(),
          " formation rounds within the last minute; round '", Shown(round),
          "' is refused by rendezvous.limits.max_rounds_per_job_per_minute = ",
          options_.max_rounds_per_minute));
    }
  }

  if (new_job) {
    job_it = jobs_.try_emplace(std::string(job_id)).first;
    job = &job_it->second;
    job->last_used = now;
    total_bytes_ += job_overhead;
  }
  if (new_round) {
    job->round_starts.push_back(now);
    job->rounds.try_emplace(std::string(round), 0);
  }
  if (new_key) {
    if (!round.empty()) ++job->rounds[round];
    job->keys.emplace(std::string(key), std::move(value));
  } else {
    *existing = std::move(value);
  }
  job->bytes = job->bytes - old_bytes + new_bytes;
  total_bytes_ = total_bytes_ - old_bytes + new_bytes;
  return absl::OkStatus();
}

void KvStore::EraseLocked(
    Job& job, absl::flat_hash_map<std::string, std::string>::iterator it) {
  const size_t bytes = EntryBytes(it->first, it->second.size());
  job.bytes -= bytes;
  total_bytes_ -= bytes;
  if (absl::string_view round = RoundOf(it->first); !round.empty()) {
    auto r = job.rounds.find(round);
    if (r != job.rounds.end() && --r->second == 0) {
      job.released.erase(round);
      job.rounds.erase(r);
    }
  }
  job.keys.erase(it);
}

void KvStore::DropJobLocked(absl::string_view job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  total_bytes_ -= it->second.bytes + it->first.size();
  jobs_.erase(it);
}

bool KvStore::AllPresent(absl::string_view job_id,
                         absl::Span<const std::string> keys) const {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return keys.empty();
  for (const std::string& key : keys) {
    if (!job->second.keys.contains(key)) return false;
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
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: value of key '", Shown(key), "' in job '",
                     Shown(job_id), "' is ", value.size(),
                     " bytes, over rendezvous.limits.max_value_bytes = ",
                     options_.max_value_bytes));
  }
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  TouchLocked(job_id, now);
  if (absl::Status s = PutLocked(job_id, key, std::string(value), now);
      !s.ok()) {
    return s;
  }
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
  TouchLocked(job_id, Now());
  absl::Status s = BlockUntilPresent(job_id, keys, deadline, cancelled);
  if (!s.ok()) {
    return absl::Status(
        s.code(),
        absl::StrCat("rendezvous Get of key '", Shown(key), "' in job '",
                     Shown(job_id), "': ", s.message()));
  }
  return jobs_.find(job_id)->second.keys.find(key)->second;
}

absl::StatusOr<std::string> KvStore::Get(absl::string_view job_id,
                                         absl::string_view key,
                                         absl::Duration timeout) {
  return GetUntil(job_id, key, absl::Now() + timeout);
}

absl::StatusOr<int64_t> KvStore::Add(absl::string_view job_id,
                                     absl::string_view key, int64_t delta) {
  if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  TouchLocked(job_id, now);
  int64_t current = 0;
  if (auto job = jobs_.find(job_id); job != jobs_.end()) {
    if (auto it = job->second.keys.find(key); it != job->second.keys.end()) {
      if (!absl::SimpleAtoi(it->second, &current)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rendezvous Add: key '", Shown(key), "' in job '", Shown(job_id),
            "' holds a value that is not a counter"));
      }
    }
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
    return absl::OutOfRangeError(absl::StrCat("rendezvous Add: counter '",
                                              Shown(key), "' in job '",
                                              Shown(job_id), "' overflows"));
  }
  current += delta;
  if (absl::Status s = PutLocked(job_id, key, absl::StrCat(current), now);
      !s.ok()) {
    return s;
  }
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
  if (keys.size() > options_.max_keys_per_job) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous Wait in job '", Shown(job_id), "' for ", keys.size(),
        " keys; a job holds at most rendezvous.limits.max_keys_per_job = ",
        options_.max_keys_per_job));
  }
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(job_id, key); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  TouchLocked(job_id, Now());
  absl::Status s = BlockUntilPresent(job_id, keys, deadline, cancelled);
  if (!s.ok()) {
    std::string missing;
    auto job = jobs_.find(job_id);
    int shown = 0;
    for (const std::string& key : keys) {
      if (job != jobs_.end() && job->second.keys.contains(key)) continue;
      if (++shown > 8) {
        absl::StrAppend(&missing, ", ...");
        break;
      }
      absl::StrAppend(&missing, missing.empty() ? "" : ", ", "'", Shown(key),
                      "'");
    }
    return absl::Status(
        s.code(), absl::StrCat("rendezvous Wait in job '", Shown(job_id),
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
  TouchLocked(job_id, Now());
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return false;
  auto it = job->second.keys.find(key);
  if (it == job->second.keys.end()) return false;
  EraseLocked(job->second, it);
  if (job->second.keys.empty()) DropJobLocked(job_id);
  return true;
}

absl::StatusOr<bool> KvStore::Release(absl::string_view job_id,
                                      absl::string_view round,
                                      absl::string_view node_id,
                                      int num_nodes) {
  if (absl::Status s = CheckKey(job_id, round); !s.ok()) return s;
  if (absl::Status s = CheckKey(job_id, node_id); !s.ok()) return s;
  if (absl::StrContains(round, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous Release: round '", Shown(round), "' contains '/'"));
  }
  if (num_nodes < 1 || num_nodes > kMaxReleaseNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous Release: ", num_nodes, " nodes is outside 1..",
                     kMaxReleaseNodes));
  }
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  TouchLocked(job_id, now);
  auto job_it = jobs_.find(job_id);
  if (job_it == jobs_.end() || !job_it->second.rounds.contains(round)) {
    return false;  // nothing left of that round
  }
  // The mark is a key of the round, so it counts against the limits.
  const std::string mark = absl::StrCat(round, "/released/", node_id);
  if (!job_it->second.keys.contains(mark)) {
    if (absl::Status s = PutLocked(job_id, mark, "", now); !s.ok()) return s;
    ++job_it->second.released[round];
  }
  Job& job = job_it->second;
  if (job.released[round] < num_nodes) return false;
  const std::string prefix = absl::StrCat(round, "/");
  const std::string kept = absl::StrCat(round, kKeptInRound);
  size_t erased = 0;
  for (auto it = job.keys.begin(); it != job.keys.end();) {
    auto next = std::next(it);
    if (absl::StartsWith(it->first, prefix) && it->first != kept) {
      EraseLocked(job, it);
      ++erased;
    }
    it = next;
  }
  job.released.erase(round);
  spdlog::debug(
      "rendezvous: job '{}' round '{}' ended on its {} nodes; {} keys deleted",
      Shown(job_id), Shown(round), num_nodes, erased);
  if (job.keys.empty()) DropJobLocked(job_id);
  return true;
}

void KvStore::DeleteJob(absl::string_view job_id) {
  absl::MutexLock lock(&mu_);
  DropJobLocked(job_id);
}

void KvStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  changed_.SignalAll();
}

size_t KvStore::NumKeys(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  return job == jobs_.end() ? 0 : job->second.keys.size();
}

size_t KvStore::JobBytes(absl::string_view job_id) const {
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  return job == jobs_.end() ? 0 : job->second.bytes;
}

size_t KvStore::TotalBytes() const {
  absl::MutexLock lock(&mu_);
  return total_bytes_;
}

size_t KvStore::NumJobs() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size();
}

}  // namespace gradd
