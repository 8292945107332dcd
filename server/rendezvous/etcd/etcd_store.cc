#include "server/rendezvous/etcd/etcd_store.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/rendezvous/store_checks.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

constexpr int kMaxReleaseNodes = 65536;
// A release at destruction runs when a job ends, on the job manager's
// control thread: never long.
constexpr absl::Duration kReleaseTimeout = absl::Seconds(2);
// A Get with a shorter timeout only reads (see Get).
constexpr absl::Duration kShortestWatch = absl::Milliseconds(20);
constexpr absl::string_view kKeptInRound = "/closed";
// An Add that loses the compare this many times in a row gives up
// (ABORTED: retry the sequence); each loss means another writer won.
constexpr int kMaxAddAttempts = 10000;

// Client-chosen text in messages (store_checks.h).
std::string Shown(absl::string_view s) { return ShownInMessage(s); }

std::string EscapeJob(absl::string_view job_id) {
  std::string out;
  out.reserve(job_id.size());
  for (char c : job_id) {
    if (c == '%') {
      out += "%25";
    } else if (c == '/') {
      out += "%2F";
    } else {
      out += c;
    }
  }
  return out;
}

// The counter `seen` holds (absent: 0), INVALID_ARGUMENT when it holds
// something else.
absl::StatusOr<int64_t> CounterOf(const mvccpb::KeyValue& seen,
                                  absl::string_view job_id,
                                  absl::string_view key) {
  int64_t current = 0;
  if (seen.mod_revision() != 0 && !absl::SimpleAtoi(seen.value(), &current)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous Add: key '", Shown(key), "' in job '",
                     Shown(job_id), "' holds a value that is not a counter"));
  }
  return current;
}

bool IsLeaseNotFound(const absl::Status& s) {
  return absl::StrContains(s.message(), "requested lease not found");
}

}  // namespace

EtcdStore::EtcdStore(std::shared_ptr<EtcdClient> client,
                     std::shared_ptr<EtcdLease> lease, Options options)
    : client_(std::move(client)),
      lease_(std::move(lease)),
      options_([&] {
        if (options.prefix.empty() || options.prefix.back() != '/') {
          options.prefix += '/';
        }
        return std::move(options);
      }()),
      call_timeout_(options_.call_timeout) {}

std::string EtcdStore::Describe() const {
  return absl::StrCat(client_->Describe(), " (prefix ", options_.prefix, ")");
}

std::string EtcdStore::JobPrefix(absl::string_view job_id) const {
  return absl::StrCat(options_.prefix, "jobs/", EscapeJob(job_id), "/");
}

std::string EtcdStore::EtcdKey(absl::string_view job_id,
                               absl::string_view key) const {
  return absl::StrCat(JobPrefix(job_id), key);
}

absl::Status EtcdStore::CheckKey(absl::string_view job_id,
                                 absl::string_view key) const {
  return CheckStoreKey(job_id, key, options_.max_key_bytes);
}

EtcdStore::~EtcdStore() {
  if (!release_when_done_.has_value()) return;
  const PendingRelease& r = *release_when_done_;
  call_timeout_ = kReleaseTimeout;
  absl::StatusOr<bool> released =
      Release(r.job_id, r.round, r.node_id, r.num_nodes);
  if (!released.ok()) {
    spdlog::debug("job '{}': telling etcd that round '{}' ended here: {}",
                  Shown(r.job_id), Shown(r.round),
                  released.status().ToString());
  }
}

void EtcdStore::ReleaseRoundWhenDone(std::string job_id, std::string round,
                                     std::string node_id, int num_nodes) {
  release_when_done_ = PendingRelease{std::move(job_id), std::move(round),
                                      std::move(node_id), num_nodes};
}

absl::StatusOr<int64_t> EtcdStore::CountUnder(const std::string& etcd_prefix) {
  etcdserverpb::RangeRequest count;
  count.set_key(etcd_prefix);
  count.set_range_end(EtcdPrefixEnd(etcd_prefix));
  count.set_count_only(true);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse got,
                   client_->Range(count, CallDeadline()));
  return got.count();
}

absl::Time EtcdStore::CallDeadline() const {
  if (call_timeout_ == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + call_timeout_;
}

absl::StatusOr<int64_t> EtcdStore::LeaseId() {
  if (lease_ == nullptr) return 0;
  return lease_->Id();
}

absl::Status EtcdStore::MapWriteError(absl::Status status,
                                      absl::string_view job_id,
                                      absl::string_view key) const {
  if (absl::StrContains(status.message(), "request is too large") ||
      absl::IsResourceExhausted(status)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: key '", Shown(key), "' in job '", Shown(job_id),
        "': etcd refused the value as too large (its --max-request-bytes): ",
        status.message()));
  }
  return status;
}

absl::Status EtcdStore::Put(absl::string_view etcd_key, absl::string_view value,
                            bool own) {
  for (int attempt = 0;; ++attempt) {
    int64_t lease = 0;
    if (own) {
      ASSIGN_OR_RETURN(lease, LeaseId());
    }
    etcdserverpb::PutRequest put;
    put.set_key(std::string(etcd_key));
    put.set_value(std::string(value));
    put.set_lease(lease);
    absl::StatusOr<etcdserverpb::PutResponse> done =
        client_->Put(put, CallDeadline());
    if (done.ok()) return absl::OkStatus();
    if (attempt == 0 && lease != 0 && IsLeaseNotFound(done.status())) {
      lease_->MarkLost(lease);
      continue;
    }
    return done.status();
  }
}

absl::Status EtcdStore::Set(absl::string_view job_id, absl::string_view key,
                            absl::string_view value) {
  RETURN_IF_ERROR(CheckKey(job_id, key));
  if (value.size() > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: value of key '", Shown(key), "' in job '",
                     Shown(job_id), "' is ", value.size(),
                     " bytes, over rendezvous.limits.max_value_bytes = ",
                     options_.max_value_bytes));
  }
  return MapWriteError(Put(EtcdKey(job_id, key), value, /*own=*/false), job_id,
                       key);
}

absl::Status EtcdStore::SetOwn(absl::string_view job_id, absl::string_view key,
                               absl::string_view value) {
  RETURN_IF_ERROR(CheckKey(job_id, key));
  if (value.size() > options_.max_value_bytes) {
    return Set(job_id, key, value);  // the same refusal
  }
  return MapWriteError(Put(EtcdKey(job_id, key), value, /*own=*/true), job_id,
                       key);
}

absl::StatusOr<std::string> EtcdStore::Get(absl::string_view job_id,
                                           absl::string_view key,
                                           absl::Duration timeout) {
  RETURN_IF_ERROR(CheckKey(job_id, key));
  const absl::Time deadline = absl::Now() + timeout;
  const std::string etcd_key = EtcdKey(job_id, key);
  while (true) {
    etcdserverpb::RangeRequest range;
    range.set_key(etcd_key);
    ASSIGN_OR_RETURN(etcdserverpb::RangeResponse got,
                     client_->Range(range, CallDeadline()));
    if (got.kvs_size() > 0)
      return std::move(*got.mutable_kvs(0)->mutable_value());
    // A probe (a wait shorter than a watch takes to set up) is answered by
    // the read alone: no watch stream for a key that is simply not there.
    if (timeout < kShortestWatch) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous Get: key '", Shown(key), "' of job '",
                       Shown(job_id), "' not set (", Describe(), ")"));
    }
    absl::Status waited = client_->WaitForKeys({etcd_key}, deadline, nullptr);
    if (absl::IsDeadlineExceeded(waited)) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous Get: key '", Shown(key), "' of job '",
                       Shown(job_id), "' not set within ",
                       absl::FormatDuration(timeout), " (", Describe(), ")"));
    }
    RETURN_IF_ERROR(waited);
    // It exists now (unless deleted again at once): read it.
  }
}

absl::StatusOr<int64_t> EtcdStore::Add(absl::string_view job_id,
                                       absl::string_view key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey(job_id, key));
  const std::string etcd_key = EtcdKey(job_id, key);
  etcdserverpb::RangeRequest range;
  range.set_key(etcd_key);
  ASSIGN_OR_RETURN(etcdserverpb::RangeResponse read,
                   client_->Range(range, CallDeadline()));
  // The key as last seen: absent is mod_revision 0, which is also what etcd
  // compares a missing key's mod_revision as.
  mvccpb::KeyValue seen;
  if (read.kvs_size() > 0) seen = read.kvs(0);
  // A read (delta 0) writes nothing: a missing counter reads 0 and stays
  // missing, so probes ("rounds/probe", the arrivals counter read by a
  // watcher) leave no key behind when the job ends.
  if (delta == 0) return CounterOf(seen, job_id, key);
  for (int attempt = 0; attempt < kMaxAddAttempts; ++attempt) {
    ASSIGN_OR_RETURN(const int64_t current, CounterOf(seen, job_id, key));
    if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta)) {
      return absl::OutOfRangeError(absl::StrCat("rendezvous Add: counter '",
                                                Shown(key), "' in job '",
                                                Shown(job_id), "' overflows"));
    }
    const int64_t next = current + delta;
    etcdserverpb::TxnRequest txn;
    etcdserverpb::Compare* cmp = txn.add_compare();
    cmp->set_key(etcd_key);
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_mod_revision(seen.mod_revision());
    etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(etcd_key);
    put->set_value(absl::StrCat(next));
    txn.add_failure()->mutable_request_range()->set_key(etcd_key);
    ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                     client_->Txn(txn, CallDeadline()));
    if (done.succeeded()) return next;
    // Another writer came first: go on from what it wrote.
    const etcdserverpb::RangeResponse& now = done.responses(0).response_range();
    seen = now.kvs_size() > 0 ? now.kvs(0) : mvccpb::KeyValue();
  }
  return absl::AbortedError(
      absl::StrCat("rendezvous Add: counter '", Shown(key), "' in job '",
                   Shown(job_id), "' kept changing under ", kMaxAddAttempts,
                   " attempts (", Describe(), ")"));
}

absl::Status EtcdStore::Wait(absl::string_view job_id,
                             absl::Span<const std::string> keys,
                             absl::Duration timeout) {
  if (job_id.empty()) {
    return absl::InvalidArgumentError("rendezvous: empty job id");
  }
  std::vector<std::string> etcd_keys;
  etcd_keys.reserve(keys.size());
  for (const std::string& key : keys) {
    RETURN_IF_ERROR(CheckKey(job_id, key));
    etcd_keys.push_back(EtcdKey(job_id, key));
  }
  const std::string job_prefix = JobPrefix(job_id);
  absl::Status waited = client_->WaitForKeys(
      etcd_keys, absl::Now() + timeout, [&](absl::string_view etcd_key) {
        absl::string_view k = etcd_key;
        absl::ConsumePrefix(&k, job_prefix);
        return absl::StrCat("'", Shown(k), "'");
      });
  if (absl::IsDeadlineExceeded(waited)) {
    absl::string_view detail = waited.message();
    const size_t at = detail.find("still missing after the wait: ");
    if (at != absl::string_view::npos) {
      detail.remove_prefix(at + sizeof("still missing after the wait: ") - 1);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous Wait in job '", Shown(job_id), "': keys ",
                     detail, " still missing after ",
                     absl::FormatDuration(timeout), " (", Describe(), ")"));
  }
  return waited;
}

absl::StatusOr<bool> EtcdStore::Delete(absl::string_view job_id,
                                       absl::string_view key) {
  RETURN_IF_ERROR(CheckKey(job_id, key));
  etcdserverpb::DeleteRangeRequest del;
  del.set_key(EtcdKey(job_id, key));
  ASSIGN_OR_RETURN(etcdserverpb::DeleteRangeResponse done,
                   client_->DeleteRange(del, CallDeadline()));
  return done.deleted() > 0;
}

absl::StatusOr<bool> EtcdStore::Release(absl::string_view job_id,
                                        absl::string_view round,
                                        absl::string_view node_id,
                                        int num_nodes) {
  RETURN_IF_ERROR(CheckKey(job_id, round));
  RETURN_IF_ERROR(CheckKey(job_id, node_id));
  if (absl::StrContains(round, '/')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous Release: round '", Shown(round), "' contains '/'"));
  }
  if (num_nodes < 1 || num_nodes > kMaxReleaseNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous Release: ", num_nodes, " nodes is outside 1..",
                     kMaxReleaseNodes));
  }
  const std::string round_prefix = EtcdKey(job_id, absl::StrCat(round, "/"));
  const std::string round_end = EtcdPrefixEnd(round_prefix);
  ASSIGN_OR_RETURN(const int64_t present, CountUnder(round_prefix));
  if (present == 0) return false;  // nothing left of that round
  const std::string marks = absl::StrCat(round_prefix, "released/");
  RETURN_IF_ERROR(Put(absl::StrCat(marks, node_id), "", /*own=*/false));
  ASSIGN_OR_RETURN(const int64_t released, CountUnder(marks));
  if (released < num_nodes) return false;
  // Everything of the round but its "closed" mark, in one transaction.
  const std::string kept = EtcdKey(job_id, absl::StrCat(round, kKeptInRound));
  etcdserverpb::TxnRequest txn;
  etcdserverpb::DeleteRangeRequest* before =
      txn.add_success()->mutable_request_delete_range();
  before->set_key(round_prefix);
  before->set_range_end(kept);
  etcdserverpb::DeleteRangeRequest* after =
      txn.add_success()->mutable_request_delete_range();
  after->set_key(kept + '\0');
  after->set_range_end(round_end);
  ASSIGN_OR_RETURN(etcdserverpb::TxnResponse done,
                   client_->Txn(txn, CallDeadline()));
  int64_t erased = 0;
  for (const etcdserverpb::ResponseOp& op : done.responses()) {
    erased += op.response_delete_range().deleted();
  }
  // Nothing of the job left but this round's "closed" mark (a job that was
  // not elastic; an elastic one is deleted by its last node, LeaveJob):
  // the job has ended everywhere, and its mark goes too, so an ended job
  // leaves no key in etcd. (A new job of the same id forms from round 1.)
  absl::StatusOr<int64_t> left = CountUnder(JobPrefix(job_id));
  if (left.ok() && *left == 1) {
    etcdserverpb::DeleteRangeRequest mark;
    mark.set_key(kept);
    if (client_->DeleteRange(mark, CallDeadline()).ok()) ++erased;
  }
  spdlog::debug(
      "rendezvous: job '{}' round '{}' ended on its {} nodes; {} keys deleted "
      "from {}",
      Shown(job_id), Shown(round), num_nodes, erased, client_->Describe());
  return true;
}

absl::StatusOr<bool> EtcdStore::CompareAndSet(
    absl::string_view job_id, absl::string_view key,
    std::optional<std::string> expected, absl::string_view value,
    absl::Span<const std::pair<std::string, std::string>> also) {
  RETURN_IF_ERROR(CheckKey(job_id, key));
  size_t bytes = value.size();
  for (const auto& [k, v] : also) {
    RETURN_IF_ERROR(CheckKey(job_id, k));
    bytes += v.size();
  }
  if (bytes > options_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: compare-and-set of key '", Shown(key),
                     "' in job '", Shown(job_id), "' writes ", bytes,
                     " bytes, over rendezvous.limits.max_value_bytes = ",
                     options_.max_value_bytes));
  }
  const std::string etcd_key = EtcdKey(job_id, key);
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* cmp = txn.add_compare();
  cmp->set_key(etcd_key);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  if (expected.has_value()) {
    // A missing key never compares equal by value.
    cmp->set_target(etcdserverpb::Compare::VALUE);
    cmp->set_value(*std::move(expected));
  } else {
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_create_revision(0);
  }
  auto put = [&](absl::string_view k, absl::string_view v) {
    etcdserverpb::PutRequest* p = txn.add_success()->mutable_request_put();
    p->set_key(std::string(k));
    p->set_value(std::string(v));
  };
  put(etcd_key, value);
  for (const auto& [k, v] : also) put(EtcdKey(job_id, k), v);
  absl::StatusOr<etcdserverpb::TxnResponse> done =
      client_->Txn(txn, CallDeadline());
  if (!done.ok()) return MapWriteError(done.status(), job_id, key);
  return done->succeeded();
}

absl::StatusOr<int64_t> EtcdStore::DeletePrefix(absl::string_view job_id,
                                                absl::string_view prefix) {
  if (prefix.empty()) {
    if (job_id.empty()) {
      return absl::InvalidArgumentError("rendezvous: empty job id");
    }
  } else {
    RETURN_IF_ERROR(CheckKey(job_id, prefix));
  }
  const std::string from = EtcdKey(job_id, prefix);
  etcdserverpb::DeleteRangeRequest del;
  del.set_key(from);
  del.set_range_end(EtcdPrefixEnd(from));
  ASSIGN_OR_RETURN(etcdserverpb::DeleteRangeResponse done,
                   client_->DeleteRange(del, CallDeadline()));
  return done.deleted();
}

absl::StatusOr<int64_t> EtcdStore::CountPrefix(absl::string_view job_id,
                                               absl::string_view prefix) {
  RETURN_IF_ERROR(CheckKey(job_id, prefix));
  return CountUnder(EtcdKey(job_id, prefix));
}

absl::Status EtcdStore::DeleteJob(absl::string_view job_id) {
  return DeletePrefix(job_id, "").status();
}

}  // namespace gradd
