// The agreement on an epoch's members (reformation_agreement.h): by a
// closer on the built-in store, by compare-and-swap on etcd.
#include "server/engine/formation/reformation_agreement.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/formation/reformation_verdict.h"
#include "spdlog/spdlog.h"

namespace gradd::reformation_internal {
namespace {

// Who the deciding node waits for: the previous epoch's nodes and every arrival
// announced (and not settled by the previous epoch) before it entered.
struct Expected {
  absl::flat_hash_set<std::string> ids;
  // The arrivals counter when it entered.
  int64_t announced = 0;
};

absl::StatusOr<std::optional<v1::ElasticMember>> ReadArrival(
    RendezvousStoreInterface& store, const ReformOptions& o, int64_t n) {
  ASSIGN_OR_RETURN(
      std::optional<std::string> bytes,
      Probe(store, o.job_id, ArrivalKey(o.reformation_prefix, n), kFollowUp));
  v1::ElasticMember arrival;
  if (!bytes.has_value() || !arrival.ParseFromString(*bytes)) {
    return std::optional<v1::ElasticMember>();
  }
  return std::optional<v1::ElasticMember>(std::move(arrival));
}

absl::StatusOr<Expected> ExpectedEntrants(RendezvousStoreInterface& store,
                                          const ReformOptions& o) {
  Expected expected;
  for (const JobNode& node : o.previous) expected.ids.insert(node.node_id);
  const std::optional<v1::ElasticMembers> before =
      StoredVerdict(store, o.job_id, o.reformation_prefix, o.epoch - 1);
  const int64_t settled = before.has_value() ? before->arrivals_seen() : 0;
  ASSIGN_OR_RETURN(expected.announced,
                   store.Add(o.job_id, ArrivalsKey(o.reformation_prefix), 0));
  for (int64_t n = settled + 1; n <= expected.announced; ++n) {
    ASSIGN_OR_RETURN(std::optional<v1::ElasticMember> arrival,
                     ReadArrival(store, o, n));
    if (arrival.has_value()) expected.ids.insert(arrival->node_id());
  }
  return expected;
}

// Reformed::arrivals_seen: every arrival announced before the closer
// entered had the settle to come (one that did not is dead, or comes late
// and announces itself again); of the later ones, those that entered.
absl::StatusOr<int64_t> SettledArrivals(
    RendezvousStoreInterface& store, const ReformOptions& o,
    int64_t announced_at_entry,
    const std::vector<v1::ElasticMember>& entrants) {
  ASSIGN_OR_RETURN(int64_t announced,
                   store.Add(o.job_id, ArrivalsKey(o.reformation_prefix), 0));
  int64_t seen = announced_at_entry;
  while (seen < announced) {
    ASSIGN_OR_RETURN(std::optional<v1::ElasticMember> arrival,
                     ReadArrival(store, o, seen + 1));
    const bool entered =
        arrival.has_value() &&
        std::any_of(entrants.begin(), entrants.end(), [&](const auto& m) {
          return m.node_id() == arrival->node_id();
        });
    if (!entered) break;
    ++seen;
  }
  return seen;
}

// The node ids in slots [from, to); a slot whose entrant died between
// taking it and filling it in is skipped.
absl::StatusOr<std::vector<std::string>> ReadSlots(
    RendezvousStoreInterface& store, const std::string& job,
    const EpochKeys& keys, int64_t from, int64_t to) {
  std::vector<std::string> ids;
  for (int64_t i = from; i < to; ++i) {
    ASSIGN_OR_RETURN(std::optional<std::string> id,
                     Probe(store, job, keys.Slot(i), kFollowUp));
    if (id.has_value()) ids.push_back(*std::move(id));
  }
  return ids;
}

// Returns once every expected node has a slot or `settle_end` has passed
// (the closer looks at the beats of the nodes it waits for every
// kPulseStep).
absl::Status AwaitEntrants(RendezvousStoreInterface& store,
                           const ReformOptions& o, const EpochKeys& keys,
                           absl::flat_hash_set<std::string> expected,
                           absl::Time settle_end) {
  // The beats of the previous epoch's nodes: the count last read and when
  // it last moved (first read: now). Arrivals do not beat yet.
  struct Pulse {
    int64_t beats = -1;
    absl::Time moved;
  };
  absl::flat_hash_map<std::string, Pulse> pulses;
  const bool watch = o.silence > absl::ZeroDuration();
  if (watch) {
    for (const JobNode& node : o.previous) pulses[node.node_id] = Pulse{};
  }
  int64_t read = 0;
  while (true) {
    ASSIGN_OR_RETURN(int64_t joined, store.Add(o.job_id, keys.Joined(), 0));
    ASSIGN_OR_RETURN(std::vector<std::string> ids,
                     ReadSlots(store, o.job_id, keys, read, joined));
    read = joined;
    for (const std::string& id : ids) expected.erase(id);
    const absl::Time now = absl::Now();
    if (expected.empty() || now >= settle_end) return absl::OkStatus();
    std::vector<std::string> silent;
    for (const std::string& id : expected) {
      auto pulse = pulses.find(id);
      if (pulse == pulses.end()) continue;
      ASSIGN_OR_RETURN(
          int64_t beats,
          store.Add(o.job_id, AliveKey(o.reformation_prefix, id), 0));
      if (beats != pulse->second.beats) pulse->second = Pulse{beats, now};
      if (beats > 0 && now - pulse->second.moved >= o.silence) {
        silent.push_back(id);
      }
    }
    for (const std::string& id : silent) {
      spdlog::info(
          "{}: node '{}' has been silent for {} (its daemon or its part of "
          "the job is gone); not waiting for it",
          Where(o), id, absl::FormatDuration(o.silence));
      expected.erase(id);
    }
    if (expected.empty()) return absl::OkStatus();
    // Sleep until the next entrant takes its slot, the settle ends, or it
    // is time to look at the beats again.
    const absl::Time until = watch && !pulses.empty()
                                 ? std::min(settle_end, now + kPulseStep)
                                 : settle_end;
    absl::Status s = store.Wait(o.job_id, {keys.Slot(read)}, Left(until));
    if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) return s;
  }
}

// The entrants in slots [0, count), by slot (first occurrence of a node id
// wins).
absl::StatusOr<std::vector<v1::ElasticMember>> ReadEntrants(
    RendezvousStoreInterface& store, const ReformOptions& o,
    const EpochKeys& keys, int64_t count) {
  ASSIGN_OR_RETURN(std::vector<std::string> ids,
                   ReadSlots(store, o.job_id, keys, 0, count));
  std::vector<v1::ElasticMember> entrants;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& id : ids) {
    if (!seen.insert(id).second) continue;
    ASSIGN_OR_RETURN(std::optional<std::string> bytes,
                     Probe(store, o.job_id, keys.Member(id), kFollowUp));
    v1::ElasticMember member;
    if (!bytes.has_value() || !member.ParseFromString(*bytes)) {
      spdlog::warn("{}: entrant '{}' left no readable membership; skipped",
                   Where(o), id);
      continue;
    }
    entrants.push_back(std::move(member));
  }
  return entrants;
}

// The closer fixes the entrant count and reads the entrants.
absl::StatusOr<std::vector<v1::ElasticMember>> CloseAndRead(
    RendezvousStoreInterface& store, const ReformOptions& o,
    const EpochKeys& keys) {
  ASSIGN_OR_RETURN(int64_t sum,
                   store.Add(o.job_id, keys.Joined(), kClosedBias));
  return ReadEntrants(store, o, keys, sum - kClosedBias);
}

// Best effort: the keys of `epoch` that nobody reads any more. "joined" is
// kept as a tombstone, so that a node arriving very late cannot open the
// epoch again.
void DeleteEpochKeys(RendezvousStoreInterface& store, const ReformOptions& o,
                     uint64_t epoch) {
  if (epoch == 0) return;
  const EpochKeys keys = KeysOf(o.reformation_prefix, epoch);
  const std::string& job = o.job_id;
  std::optional<v1::ElasticMembers> verdict =
      StoredVerdict(store, job, o.reformation_prefix, epoch);
  absl::StatusOr<int64_t> joined = store.Add(job, keys.Joined(), 0);
  const int64_t slots =
      joined.ok() ? (*joined >= kClosedBias ? *joined - kClosedBias : *joined)
                  : 0;
  std::vector<std::string> doomed = {keys.Closed(), keys.Members(), keys.Plan(),
                                     absl::StrCat(keys.Gloo(), "/pairkey")};
  for (int64_t i = 0; i < slots; ++i) {
    absl::StatusOr<std::optional<std::string>> id =
        Probe(store, job, keys.Slot(i), kProbe);
    if (id.ok() && id->has_value()) doomed.push_back(keys.Member(**id));
    doomed.push_back(keys.Slot(i));
  }
  if (verdict.has_value()) {
    // GlooBackend's keys (gloo_backend.h); "mesh/<r>" and "mesh/rank_<r>"
    // are Gloo's own (connectFullMesh), checked by reformation_test.
    for (int r = 0; r < verdict->entrants_size(); ++r) {
      for (const char* what :
           {"/arrived/", "/failed/", "/mesh/", "/mesh/rank_"}) {
        doomed.push_back(absl::StrCat(keys.Gloo(), what, r));
      }
    }
    for (int64_t n = 1; n <= verdict->arrivals_seen(); ++n) {
      doomed.push_back(ArrivalKey(o.reformation_prefix, n));
    }
    // A CUDA job's communicator of that epoch (nccl_job_setup.h).
    for (std::string& key :
         NcclJobSetupKeys(keys.prefix, verdict->entrants_size())) {
      doomed.push_back(std::move(key));
    }
  }
  for (const std::string& key : doomed) (void)store.Delete(job, key);
}

}  // namespace

absl::StatusOr<v1::ElasticMembers> CloseEpoch(RendezvousStoreInterface& store,
                                              const ReformOptions& o,
                                              const EpochKeys& keys,
                                              absl::Time entered,
                                              absl::Time deadline) {
  ASSIGN_OR_RETURN(Expected expected, ExpectedEntrants(store, o));
  RETURN_IF_ERROR(AwaitEntrants(store, o, keys, std::move(expected.ids),
                                std::min(entered + o.settle, deadline)));
  ASSIGN_OR_RETURN(std::vector<v1::ElasticMember> entrants,
                   CloseAndRead(store, o, keys));
  ASSIGN_OR_RETURN(int64_t arrivals_seen,
                   SettledArrivals(store, o, expected.announced, entrants));
  v1::ElasticMembers verdict =
      Decide(o, entrants, arrivals_seen,
             StoredVerdict(store, o.job_id, o.reformation_prefix, o.epoch - 1));
  RETURN_IF_ERROR(store.Set(o.job_id, LastEpochKey(o.reformation_prefix),
                            absl::StrCat(o.epoch)));
  RETURN_IF_ERROR(
      store.Set(o.job_id, keys.Members(), verdict.SerializeAsString()));
  spdlog::info(
      "{}: closed with {} node(s) after {}; lost [{}], admitted [{}], {} "
      "refused",
      Where(o), verdict.entrants_size(),
      absl::FormatDuration(absl::Now() - entered),
      absl::StrJoin(verdict.lost(), ", "),
      absl::StrJoin(verdict.admitted(), ", "), verdict.refused_size());
  DeleteEpochKeys(store, o, o.epoch - 1);
  return verdict;
}
absl::StatusOr<uint64_t> LastClosedEpoch(
    RendezvousStoreInterface& store, const std::string& job,
    const std::string& reformation_prefix) {
  ASSIGN_OR_RETURN(std::optional<std::string> text,
                   Probe(store, job, LastEpochKey(reformation_prefix), kProbe));
  uint64_t epoch = 0;
  if (text.has_value() && !absl::SimpleAtoi(*text, &epoch)) {
    return absl::InternalError(
        absl::StrCat("'", LastEpochKey(reformation_prefix), "' holds '", *text,
                     "', not an epoch number"));
  }
  return epoch;
}

// The verdict of `epoch` when it is still in the store (nullopt otherwise).
std::optional<v1::ElasticMembers> StoredVerdict(
    RendezvousStoreInterface& store, const std::string& job,
    const std::string& reformation_prefix, uint64_t epoch) {
  if (epoch == 0) return std::nullopt;
  absl::StatusOr<std::optional<std::string>> bytes =
      Probe(store, job, KeysOf(reformation_prefix, epoch).Members(), kProbe);
  v1::ElasticMembers verdict;
  if (!bytes.ok() || !bytes->has_value() || !verdict.ParseFromString(**bytes)) {
    return std::nullopt;
  }
  return verdict;
}

absl::StatusOr<v1::ElasticMembers> AwaitVerdict(RendezvousStoreInterface& store,
                                                const ReformOptions& o,
                                                const EpochKeys& keys,
                                                absl::Time deadline) {
  absl::StatusOr<std::string> bytes =
      store.Get(o.job_id, keys.Members(), Left(deadline));
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no node closed the epoch within ", absl::FormatDuration(o.timeout),
          " (the nodes of the previous epoch never came: ",
          bytes.status().message(), ")"));
    }
    return bytes.status();
  }
  v1::ElasticMembers verdict;
  if (!verdict.ParseFromString(*bytes)) {
    return absl::InternalError(
        absl::StrCat("'", keys.Members(), "' is not a readable verdict"));
  }
  return verdict;
}
namespace {

// How often a node waiting on etcd looks at the entrants and the nodes'
// liveness keys (each look is a few reads).
constexpr absl::Duration kLeasedStep = absl::Milliseconds(250);

bool Mentions(const v1::ElasticMembers& verdict, const std::string& id) {
  return std::any_of(verdict.entrants().begin(), verdict.entrants().end(),
                     [&](const auto& e) { return e.node_id() == id; }) ||
         std::any_of(verdict.refused().begin(), verdict.refused().end(),
                     [&](const auto& r) { return r.node_id() == id; });
}

absl::StatusOr<std::optional<v1::ElasticMembers>> ParseVerdict(
    const EpochKeys& keys, const std::string& bytes) {
  v1::ElasticMembers verdict;
  if (!verdict.ParseFromString(bytes)) {
    return absl::InternalError(
        absl::StrCat("'", keys.Members(), "' is not a readable verdict"));
  }
  return std::optional<v1::ElasticMembers>(std::move(verdict));
}

}  // namespace

absl::Status StillRunning(RendezvousStoreInterface& store,
                          const ReformOptions& o) {
  ASSIGN_OR_RETURN(
      std::optional<std::string> running,
      Probe(store, o.job_id, RunningKey(o.reformation_prefix), kProbe));
  if (running.has_value()) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("the job's keys are gone from ", store.Describe(),
                   " (it ended on every other node); nothing to re-form"));
}

absl::StatusOr<std::optional<v1::ElasticMembers>> AgreeByTransaction(
    RendezvousStoreInterface& store, const ReformOptions& o,
    const EpochKeys& keys, absl::Time entered, absl::Time deadline) {
  const bool survivor = IsSurvivor(o);
  Expected expected;
  if (survivor) {
    ASSIGN_OR_RETURN(expected, ExpectedEntrants(store, o));
  }
  absl::flat_hash_set<std::string> previous;
  for (const JobNode& node : o.previous) previous.insert(node.node_id);
  const absl::Time settle_end = std::min(entered + o.settle, deadline);
  int64_t read = 0;
  while (true) {
    // Decided already (by another node, or by this one's last try)?
    ASSIGN_OR_RETURN(std::optional<std::string> bytes,
                     Probe(store, o.job_id, keys.Members(), kProbe));
    if (bytes.has_value()) {
      ASSIGN_OR_RETURN(std::optional<v1::ElasticMembers> verdict,
                       ParseVerdict(keys, *bytes));
      if (!Mentions(*verdict, o.node_id)) return std::nullopt;  // too late
      return verdict;
    }
    // Decided since the probe above (the verdict is there now), or decided
    // and gone (a later epoch's decider deleted it: too late).
    ASSIGN_OR_RETURN(uint64_t last,
                     LastClosedEpoch(store, o.job_id, o.reformation_prefix));
    if (last >= o.epoch) {
      ASSIGN_OR_RETURN(bytes, Probe(store, o.job_id, keys.Members(), kProbe));
      if (!bytes.has_value()) return std::nullopt;
      continue;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no node closed the epoch within ", absl::FormatDuration(o.timeout),
          " (", store.Describe(), ")"));
    }
    if (survivor) {
      ASSIGN_OR_RETURN(int64_t joined, store.Add(o.job_id, keys.Joined(), 0));
      ASSIGN_OR_RETURN(std::vector<std::string> ids,
                       ReadSlots(store, o.job_id, keys, read, joined));
      read = joined;
      for (const std::string& id : ids) expected.ids.erase(id);
      // A node of the previous epoch whose liveness key went with its
      // daemon's lease (or that left the job, deleting it) is not waited
      // for. Arrivals have announced themselves; they get the settle.
      std::vector<std::string> gone;
      for (const std::string& id : expected.ids) {
        if (!previous.contains(id)) continue;
        ASSIGN_OR_RETURN(
            std::optional<std::string> alive,
            Probe(store, o.job_id, AliveKey(o.reformation_prefix, id), kProbe));
        if (!alive.has_value()) gone.push_back(id);
      }
      for (const std::string& id : gone) {
        spdlog::info(
            "{}: node '{}' is gone from etcd (its daemon's lease expired or it "
            "left the job); not waiting for it",
            Where(o), id);
        expected.ids.erase(id);
      }
      if (expected.ids.empty() || now >= settle_end) {
        // The job still runs somewhere: its last node to leave deletes its
        // keys (LeaveJob), and a verdict written then would stay forever.
        RETURN_IF_ERROR(StillRunning(store, o));
        ASSIGN_OR_RETURN(std::vector<v1::ElasticMember> entrants,
                         ReadEntrants(store, o, keys, joined));
        ASSIGN_OR_RETURN(
            int64_t arrivals_seen,
            SettledArrivals(store, o, expected.announced, entrants));
        v1::ElasticMembers verdict = Decide(
            o, entrants, arrivals_seen,
            StoredVerdict(store, o.job_id, o.reformation_prefix, o.epoch - 1));
        // The compare-and-swap on the job's epoch key: it moves from the
        // last epoch to this one together with the verdict, once.
        std::optional<std::string> was;
        if (o.epoch > 1) was = absl::StrCat(o.epoch - 1);
        const std::pair<std::string, std::string> also[] = {
            {keys.Members(), verdict.SerializeAsString()}};
        ASSIGN_OR_RETURN(
            bool decided,
            store.CompareAndSet(o.job_id, LastEpochKey(o.reformation_prefix),
                                was, absl::StrCat(o.epoch), also));
        if (decided) {
          spdlog::info(
              "{}: decided with {} node(s) after {}; lost [{}], admitted [{}], "
              "{} refused",
              Where(o), verdict.entrants_size(),
              absl::FormatDuration(absl::Now() - entered),
              absl::StrJoin(verdict.lost(), ", "),
              absl::StrJoin(verdict.admitted(), ", "), verdict.refused_size());
          // The previous epoch's keys, all at once (best effort): nobody
          // can decide it again, the epoch key has moved on.
          if (o.epoch > 1) {
            (void)store.DeletePrefix(
                o.job_id,
                absl::StrCat(KeysOf(o.reformation_prefix, o.epoch - 1).prefix,
                             "/"));
          }
          return std::optional<v1::ElasticMembers>(std::move(verdict));
        }
        // Another node decided first (its verdict is read next), or the
        // epoch key no longer holds the last epoch: a later epoch went on
        // (this node is too late, next) or the job's keys are gone.
        ASSIGN_OR_RETURN(
            uint64_t now_last,
            LastClosedEpoch(store, o.job_id, o.reformation_prefix));
        if (now_last + 1 < o.epoch) RETURN_IF_ERROR(StillRunning(store, o));
        continue;
      }
    }
    // Until the verdict, the next entrant, or the next look at the nodes'
    // liveness. A watch wakes it at the verdict, so the step only bounds
    // how soon a new entrant or a gone lease is seen.
    const absl::Time until =
        survivor ? std::min({settle_end, deadline, now + kLeasedStep})
                 : std::min(deadline, now + kLeasedStep);
    absl::Status s = store.Wait(o.job_id, {keys.Members()}, Left(until));
    if (!s.ok() && !absl::IsDeadlineExceeded(s)) return s;
  }
}
}  // namespace gradd::reformation_internal
