#include "server/engine/formation/reformation.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "gradd/v1/rendezvous.pb.h"
#include "server/backends/gloo/gloo_backend.h"
#include "server/engine/formation/nccl_job_setup.h"
#include "server/engine/formation/node_formation.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

// The closer adds this to "joined": every later Add(1) returns more than it,
// so an entrant knows at once that it came too late (and the closer reads
// the entrant count back as the sum minus the bias).
constexpr int64_t kClosedBias = int64_t{1} << 40;
// A key that is there, or not: the store's answer, not a wait.
constexpr absl::Duration kProbe = absl::Milliseconds(1);
// A key another node writes right after a counter it already bumped (a
// slot id after "joined", an arrival's member after "arrivals").
constexpr absl::Duration kFollowUp = absl::Seconds(2);
// Every step after the agreement gets at least this long (the others are
// just as late, as in FormNodeJob).
constexpr absl::Duration kMinStep = absl::Seconds(2);

absl::Status Prefixed(const absl::Status& s, absl::string_view what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

std::string Where(const ReformOptions& o) {
  return absl::StrCat("re-forming job '", o.job_id, "' (epoch ", o.epoch,
                      ") on node '", o.node_id, "'");
}

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// The keys of one epoch (see the header).
struct EpochKeys {
  std::string prefix;

  std::string Joined() const { return absl::StrCat(prefix, "/joined"); }
  std::string Slot(int64_t i) const {
    return absl::StrCat(prefix, "/slot/", i);
  }
  std::string Member(const std::string& id) const {
    return absl::StrCat(prefix, "/member/", id);
  }
  std::string Closed() const { return absl::StrCat(prefix, "/closed"); }
  std::string Members() const { return absl::StrCat(prefix, "/members"); }
  std::string Plan() const { return absl::StrCat(prefix, "/plan"); }
  std::string Gloo() const { return absl::StrCat(prefix, "/gloo"); }
};

EpochKeys KeysOf(const std::string& elastic_prefix, uint64_t epoch) {
  return EpochKeys{absl::StrCat(elastic_prefix, "/epoch", epoch)};
}
std::string ArrivalsKey(const std::string& elastic_prefix) {
  return absl::StrCat(elastic_prefix, "/arrivals");
}
std::string ArrivalKey(const std::string& elastic_prefix, int64_t n) {
  return absl::StrCat(elastic_prefix, "/arrival/", n);
}
std::string AliveKey(const std::string& elastic_prefix,
                     const std::string& node_id) {
  return absl::StrCat(elastic_prefix, "/alive/", node_id);
}
std::string LastEpochKey(const std::string& elastic_prefix) {
  return absl::StrCat(elastic_prefix, "/epoch");
}
std::string RunningKey(const std::string& elastic_prefix) {
  return absl::StrCat(elastic_prefix, "/running");
}

// The value of `key`, or nullopt when it is not there within `wait`.
absl::StatusOr<std::optional<std::string>> Probe(
    RendezvousStoreInterface& store, const std::string& job,
    const std::string& key, absl::Duration wait) {
  absl::StatusOr<std::string> value = store.Get(job, key, wait);
  if (value.ok()) return std::optional<std::string>(*std::move(value));
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return std::optional<std::string>();
  }
  return value.status();
}

bool IsSurvivor(const ReformOptions& o) {
  return std::any_of(o.previous.begin(), o.previous.end(),
                     [&](const JobNode& n) { return n.node_id == o.node_id; });
}

v1::ElasticMember MemberOf(const ReformOptions& o) {
  v1::ElasticMember m;
  m.set_node_id(o.node_id);
  m.set_local_world_size(o.local_world_size);
  m.set_completed_iteration(o.completed_iteration);
  m.set_sync_seq(o.sync_seq);
  m.set_requested_offset(o.requested_offset);
  for (v1::ParamSpec& p : Fingerprint(o.params)) *m.add_params() = std::move(p);
  m.set_reason(o.reason);
  m.set_initial_world_size(o.initial_world_size);
  for (int r : o.rejoined_local_ranks) m.add_rejoined_local_ranks(r);
  return m;
}

// The last epoch closed (0: none yet).
absl::StatusOr<uint64_t> LastClosedEpoch(RendezvousStoreInterface& store,
                                         const std::string& job,
                                         const std::string& elastic_prefix) {
  ASSIGN_OR_RETURN(std::optional<std::string> text,
                   Probe(store, job, LastEpochKey(elastic_prefix), kProbe));
  uint64_t epoch = 0;
  if (text.has_value() && !absl::SimpleAtoi(*text, &epoch)) {
    return absl::InternalError(absl::StrCat("'", LastEpochKey(elastic_prefix),
                                            "' holds '", *text,
                                            "', not an epoch number"));
  }
  return epoch;
}

// The verdict of `epoch` when it is still in the store (nullopt otherwise).
std::optional<v1::ElasticMembers> StoredVerdict(
    RendezvousStoreInterface& store, const std::string& job,
    const std::string& elastic_prefix, uint64_t epoch) {
  if (epoch == 0) return std::nullopt;
  absl::StatusOr<std::optional<std::string>> bytes =
      Probe(store, job, KeysOf(elastic_prefix, epoch).Members(), kProbe);
  v1::ElasticMembers verdict;
  if (!bytes.ok() || !bytes->has_value() || !verdict.ParseFromString(**bytes)) {
    return std::nullopt;
  }
  return verdict;
}

// ---------------------------------------------------------------------------
// The closer.

// Who the closer waits for: the previous epoch's nodes and every arrival
// announced (and not settled by the previous epoch) before it entered.
struct Expected {
  absl::flat_hash_set<std::string> ids;
  // The arrivals counter when the closer entered.
  int64_t announced = 0;
};

absl::StatusOr<std::optional<v1::ElasticMember>> ReadArrival(
    RendezvousStoreInterface& store, const ReformOptions& o, int64_t n) {
  ASSIGN_OR_RETURN(
      std::optional<std::string> bytes,
      Probe(store, o.job_id, ArrivalKey(o.elastic_prefix, n), kFollowUp));
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
      StoredVerdict(store, o.job_id, o.elastic_prefix, o.epoch - 1);
  const int64_t settled = before.has_value() ? before->arrivals_seen() : 0;
  ASSIGN_OR_RETURN(expected.announced,
                   store.Add(o.job_id, ArrivalsKey(o.elastic_prefix), 0));
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
                   store.Add(o.job_id, ArrivalsKey(o.elastic_prefix), 0));
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

// Returns once every expected node has a slot or `settle_end` has passed.
// How often the closer looks at the beats of the nodes it waits for.
constexpr absl::Duration kPulseStep = absl::Milliseconds(100);

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
      ASSIGN_OR_RETURN(int64_t beats,
                       store.Add(o.job_id, AliveKey(o.elastic_prefix, id), 0));
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

// Fixes the entrant count and reads the entrants, by slot (first
// occurrence of a node id wins).
absl::StatusOr<std::vector<v1::ElasticMember>> CloseAndRead(
    RendezvousStoreInterface& store, const ReformOptions& o,
    const EpochKeys& keys) {
  ASSIGN_OR_RETURN(int64_t sum,
                   store.Add(o.job_id, keys.Joined(), kClosedBias));
  ASSIGN_OR_RETURN(std::vector<std::string> ids,
                   ReadSlots(store, o.job_id, keys, 0, sum - kClosedBias));
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

std::vector<v1::ParamSpec> ParamsOf(const v1::ElasticMember& m) {
  return {m.params().begin(), m.params().end()};
}

// Global rank offsets: survivors keep theirs; a returning node gets the one
// it asks for when that range is free; the others go after the highest.
void AssignOffsets(const ReformOptions& o,
                   const std::vector<const v1::ElasticMember*>& order,
                   const absl::flat_hash_map<std::string, int>& departed,
                   v1::ElasticMembers* verdict) {
  absl::flat_hash_map<std::string, int> kept;
  for (const JobNode& node : o.previous) {
    kept[node.node_id] = node.global_rank_offset;
  }
  std::vector<std::pair<int, int>> taken;  // [begin, end)
  auto is_free = [&](int begin, int size) {
    if (begin < 0) return false;
    return std::none_of(taken.begin(), taken.end(), [&](const auto& r) {
      return begin < r.second && r.first < begin + size;
    });
  };
  std::vector<int> offsets(order.size(), -1);
  auto place = [&](size_t i, int begin) {
    const int size = order[i]->local_world_size();
    if (!is_free(begin, size)) return;
    offsets[i] = begin;
    taken.emplace_back(begin, begin + size);
  };
  // Survivors first, then returning nodes, so that neither loses its
  // offsets to a node placed before it.
  for (size_t i = 0; i < order.size(); ++i) {
    auto it = kept.find(order[i]->node_id());
    if (it != kept.end()) place(i, it->second);
  }
  // A returning node: the offset it asks for (a late survivor), else the
  // one it held when it was lost (an arriving daemon asks for none).
  for (size_t i = 0; i < order.size(); ++i) {
    if (kept.contains(order[i]->node_id())) continue;
    int begin = order[i]->requested_offset();
    if (begin < 0) {
      auto it = departed.find(order[i]->node_id());
      if (it != departed.end()) begin = it->second;
    }
    place(i, begin);
  }
  int highest = 0;
  for (const auto& r : taken) highest = std::max(highest, r.second);
  for (size_t i = 0; i < order.size(); ++i) {
    if (offsets[i] < 0) {
      offsets[i] = highest;
      highest += order[i]->local_world_size();
    }
    v1::ElasticEntrant* e = verdict->add_entrants();
    e->set_node_id(order[i]->node_id());
    e->set_global_rank_offset(offsets[i]);
    e->set_local_world_size(order[i]->local_world_size());
  }
}

// Arrivals (entrants not in the previous epoch) by node id, admitted while
// their model matches the reference and the job has fewer than max_nodes.
void AdmitArrivals(const ReformOptions& o,
                   const std::vector<v1::ElasticMember>& entrants,
                   const v1::ElasticMember* reference,
                   std::vector<const v1::ElasticMember*>* order,
                   v1::ElasticMembers* verdict) {
  absl::flat_hash_set<std::string> previous;
  for (const JobNode& node : o.previous) previous.insert(node.node_id);
  std::vector<const v1::ElasticMember*> arrivals;
  for (const v1::ElasticMember& m : entrants) {
    if (!previous.contains(m.node_id())) arrivals.push_back(&m);
  }
  std::sort(arrivals.begin(), arrivals.end(), [](const auto* a, const auto* b) {
    return a->node_id() < b->node_id();
  });
  auto refuse = [&](const v1::ElasticMember& m, std::string reason) {
    v1::ElasticRefusal* r = verdict->add_refused();
    r->set_node_id(m.node_id());
    r->set_reason(std::move(reason));
  };
  for (const v1::ElasticMember* a : arrivals) {
    std::optional<std::string> mismatch;
    if (reference != nullptr) {
      mismatch = DescribeFingerprintMismatch(ParamsOf(*reference),
                                             reference->node_id(), ParamsOf(*a),
                                             a->node_id());
    }
    if (mismatch.has_value()) {
      refuse(*a, absl::StrCat("its model differs from the job's: ", *mismatch));
    } else if (static_cast<int>(order->size()) >= o.max_nodes) {
      refuse(*a, absl::StrCat("the job already has its max_nodes = ",
                              o.max_nodes, " nodes"));
    } else {
      order->push_back(a);
      verdict->add_admitted(a->node_id());
    }
  }
}

// Why the job fails: who is left, who is lost and the entrants' reasons.
std::string TooFewNodes(
    const ReformOptions& o, const std::vector<const v1::ElasticMember*>& order,
    const google::protobuf::RepeatedPtrField<std::string>& lost) {
  std::vector<std::string> ids, reasons;
  for (const v1::ElasticMember* m : order) {
    ids.push_back(m->node_id());
    if (!m->reason().empty() && std::find(reasons.begin(), reasons.end(),
                                          m->reason()) == reasons.end()) {
      reasons.push_back(m->reason());
    }
  }
  return absl::StrCat(
      "only ", order.size(), " node(s) (", absl::StrJoin(ids, ", "),
      ") re-formed job '", o.job_id, "' in epoch ", o.epoch,
      ", fewer than min_nodes = ", o.min_nodes,
      "; lost: ", lost.empty() ? "none" : absl::StrJoin(lost, ", "), " (",
      reasons.empty() ? "no reason given" : absl::StrJoin(reasons, "; "), ")");
}

// "'a'" or "'a', 'b'".
std::string Quoted(const google::protobuf::RepeatedPtrField<std::string>& ids) {
  std::vector<std::string> q;
  for (const std::string& id : ids) q.push_back(absl::StrCat("'", id, "'"));
  return absl::StrJoin(q, ", ");
}

// What the re-formation was, for every node (ElasticMembers.cause): a node
// lost wins over a node admitted, which wins over a rank restart; the
// line names the nodes (and ranks) it was about.
void DecideCause(const std::vector<const v1::ElasticMember*>& order,
                 v1::ElasticMembers* verdict) {
  const absl::flat_hash_set<std::string> admitted(verdict->admitted().begin(),
                                                  verdict->admitted().end());
  std::vector<std::string> rejoined, others;
  for (const v1::ElasticMember* m : order) {
    for (int r : m->rejoined_local_ranks()) {
      rejoined.push_back(
          absl::StrCat("local rank ", r, " of node '", m->node_id(), "'"));
    }
    // What the survivors saw (an arrival's "asks to be admitted" is said
    // by the admission itself).
    if (m->rejoined_local_ranks().empty() && !m->reason().empty() &&
        !admitted.contains(m->node_id()) &&
        std::find(others.begin(), others.end(), m->reason()) == others.end()) {
      others.push_back(m->reason());
    }
  }
  std::string rejoin_line;
  if (!rejoined.empty()) {
    rejoin_line = absl::StrCat(absl::StrJoin(rejoined, ", "), " restarted");
  }
  auto also = [&](std::string line) {
    return rejoin_line.empty() ? line : absl::StrCat(line, "; ", rejoin_line);
  };
  if (!verdict->lost().empty()) {
    verdict->set_cause(v1::REFORM_CAUSE_NODE_LOST);
    verdict->set_reason(also(absl::StrCat(
        "node", verdict->lost_size() > 1 ? "s " : " ", Quoted(verdict->lost()),
        " lost", others.empty() ? "" : absl::StrCat(" (", others[0], ")"))));
  } else if (!verdict->admitted().empty()) {
    verdict->set_cause(v1::REFORM_CAUSE_NODE_ADMITTED);
    verdict->set_reason(
        also(absl::StrCat("node", verdict->admitted_size() > 1 ? "s " : " ",
                          Quoted(verdict->admitted()), " admitted")));
  } else if (!rejoin_line.empty()) {
    verdict->set_cause(v1::REFORM_CAUSE_RANK_REJOINED);
    verdict->set_reason(rejoin_line);
  } else {
    verdict->set_cause(v1::REFORM_CAUSE_OTHER);
    for (const v1::ElasticRefusal& r : verdict->refused()) {
      others.push_back(
          absl::StrCat("node '", r.node_id(), "' not admitted: ", r.reason()));
    }
    verdict->set_reason(others.empty() ? "the nodes' group broke"
                                       : absl::StrJoin(others, "; "));
  }
}

// The verdict on `entrants` (a pure function of what the closer read).
// `before`: the previous epoch's verdict (none for epoch 1).
v1::ElasticMembers Decide(const ReformOptions& o,
                          const std::vector<v1::ElasticMember>& entrants,
                          int64_t arrivals_seen,
                          const std::optional<v1::ElasticMembers>& before) {
  v1::ElasticMembers verdict;
  verdict.set_epoch(o.epoch);
  verdict.set_arrivals_seen(arrivals_seen);
  absl::flat_hash_map<std::string, const v1::ElasticMember*> by_id;
  for (const v1::ElasticMember& m : entrants) by_id[m.node_id()] = &m;

  std::vector<const v1::ElasticMember*> order;
  for (const JobNode& node : o.previous) {
    auto it = by_id.find(node.node_id);
    if (it != by_id.end()) {
      order.push_back(it->second);
    } else {
      verdict.add_lost(node.node_id);
    }
  }
  AdmitArrivals(o, entrants, order.empty() ? nullptr : order.front(), &order,
                &verdict);
  // The departed: carried from the previous verdict, plus the nodes lost
  // now; whoever is in the new membership is no longer departed.
  absl::flat_hash_map<std::string, int> departed;
  std::vector<v1::ElasticEntrant> departed_order;
  auto depart = [&](const v1::ElasticEntrant& e) {
    if (departed.emplace(e.node_id(), e.global_rank_offset()).second) {
      departed_order.push_back(e);
    } else {
      departed[e.node_id()] = e.global_rank_offset();
      for (v1::ElasticEntrant& d : departed_order) {
        if (d.node_id() == e.node_id()) d = e;
      }
    }
  };
  if (before.has_value()) {
    for (const v1::ElasticEntrant& e : before->departed()) depart(e);
  }
  for (const JobNode& node : o.previous) {
    if (by_id.contains(node.node_id)) continue;
    v1::ElasticEntrant e;
    e.set_node_id(node.node_id);
    e.set_global_rank_offset(node.global_rank_offset);
    e.set_local_world_size(node.local_world_size);
    depart(e);
  }
  AssignOffsets(o, order, departed, &verdict);
  for (const v1::ElasticEntrant& e : departed_order) {
    const bool back =
        std::any_of(order.begin(), order.end(),
                    [&](const auto* m) { return m->node_id() == e.node_id(); });
    if (!back) *verdict.add_departed() = e;
  }
  for (const v1::ElasticMember* m : order) {
    verdict.set_max_completed(
        std::max(verdict.max_completed(), m->completed_iteration()));
    verdict.set_sync_seq(std::max(verdict.sync_seq(), m->sync_seq()));
  }
  verdict.set_sync_seq(verdict.sync_seq() + 1);
  // The job's initial world size for the arrivals: the largest any entrant
  // reported (reformation.h "members"; arrivals report 0).
  for (const v1::ElasticMember& m : entrants) {
    verdict.set_initial_world_size(
        std::max(verdict.initial_world_size(), m.initial_world_size()));
  }

  DecideCause(order, &verdict);
  if (static_cast<int>(order.size()) < o.min_nodes) {
    verdict.set_failed(true);
    verdict.set_error(TooFewNodes(o, order, verdict.lost()));
  }
  return verdict;
}

// Best effort: the keys of `epoch` that nobody reads any more. "joined" is
// kept as a tombstone, so that a node arriving very late cannot open the
// epoch again.
void DeleteEpochKeys(RendezvousStoreInterface& store, const ReformOptions& o,
                     uint64_t epoch) {
  if (epoch == 0) return;
  const EpochKeys keys = KeysOf(o.elastic_prefix, epoch);
  const std::string& job = o.job_id;
  std::optional<v1::ElasticMembers> verdict =
      StoredVerdict(store, job, o.elastic_prefix, epoch);
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
      doomed.push_back(ArrivalKey(o.elastic_prefix, n));
    }
    // A CUDA job's communicator of that epoch (nccl_job_setup.h).
    for (std::string& key :
         NcclJobSetupKeys(keys.prefix, verdict->entrants_size())) {
      doomed.push_back(std::move(key));
    }
  }
  for (const std::string& key : doomed) (void)store.Delete(job, key);
}

// The closer's part: wait, close, decide, publish.
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
             StoredVerdict(store, o.job_id, o.elastic_prefix, o.epoch - 1));
  RETURN_IF_ERROR(store.Set(o.job_id, LastEpochKey(o.elastic_prefix),
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

// ---------------------------------------------------------------------------
// Every entrant.

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

ReformCause CauseOf(v1::ReformCause cause) {
  switch (cause) {
    case v1::REFORM_CAUSE_NODE_LOST:
      return ReformCause::kNodeLost;
    case v1::REFORM_CAUSE_NODE_ADMITTED:
      return ReformCause::kNodeAdmitted;
    case v1::REFORM_CAUSE_RANK_REJOINED:
      return ReformCause::kRankRejoined;
    case v1::REFORM_CAUSE_OTHER:
      return ReformCause::kOther;
    default:
      return ReformCause::kUnknown;
  }
}

// This node's place in the verdict.
absl::StatusOr<Reformed> ApplyVerdict(const ReformOptions& o,
                                      const EpochKeys& keys,
                                      const v1::ElasticMembers& verdict) {
  if (verdict.failed()) return absl::FailedPreconditionError(verdict.error());
  for (const v1::ElasticRefusal& r : verdict.refused()) {
    if (r.node_id() == o.node_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("not admitted into the running job: ", r.reason()));
    }
  }
  Reformed out;
  out.epoch = o.epoch;
  out.store_prefix = keys.prefix;
  out.max_completed = verdict.max_completed();
  out.behind = o.completed_iteration < verdict.max_completed();
  out.sync_seq = verdict.sync_seq();
  out.lost.assign(verdict.lost().begin(), verdict.lost().end());
  out.admitted.assign(verdict.admitted().begin(), verdict.admitted().end());
  out.arrivals_seen = verdict.arrivals_seen();
  out.initial_world_size = verdict.initial_world_size();
  out.cause = CauseOf(verdict.cause());
  for (const v1::ElasticEntrant& e : verdict.departed()) {
    out.departed.push_back(e.node_id());
  }
  out.reason = verdict.reason().empty() ? o.reason : verdict.reason();
  JobLayout& layout = out.layout;
  layout.node_rank = -1;
  for (const v1::ElasticEntrant& e : verdict.entrants()) {
    const int rank = static_cast<int>(layout.nodes.size());
    layout.nodes.push_back(JobNode{e.node_id(), rank, e.local_world_size(),
                                   e.global_rank_offset()});
    layout.world_size += e.local_world_size();
    if (e.node_id() == o.node_id) {
      layout.node_rank = rank;
      layout.global_rank_offset = e.global_rank_offset();
    }
  }
  layout.num_nodes = static_cast<int>(layout.nodes.size());
  if (layout.node_rank < 0) {
    return absl::AbortedError(absl::StrCat(
        "this node is not among the epoch's members (",
        absl::StrJoin(layout.NodeIds(), ", "), "); form the job again"));
  }
  return out;
}

// New node rank 0 republishes the job's plan; an arrival adopts it.
absl::Status SharePlan(RendezvousStoreInterface& store, const ReformOptions& o,
                       const EpochKeys& keys, absl::Time deadline,
                       Reformed* out) {
  out->plan = o.plan;
  if (out->layout.node_rank == 0) {
    if (!o.plan.has_value()) return absl::OkStatus();
    return Prefixed(store.Set(o.job_id, keys.Plan(), SerializePlan(*o.plan)),
                    "publishing the bucket plan");
  }
  if (IsSurvivor(o)) return absl::OkStatus();
  const std::string& leader = out->layout.nodes[0].node_id;
  absl::StatusOr<std::string> bytes =
      store.Get(o.job_id, keys.Plan(), std::max(Left(deadline), kMinStep));
  if (!bytes.ok()) {
    return Prefixed(bytes.status(),
                    absl::StrCat("waiting for the bucket plan of '", leader,
                                 "' (node rank 0)"));
  }
  absl::StatusOr<BucketPlan> plan = ParsePlan(*bytes, o.params);
  if (!plan.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the bucket plan of '", leader,
                     "' (node rank 0) does not fit this node's model: ",
                     plan.status().message()));
  }
  out->plan = *std::move(plan);
  return absl::OkStatus();
}

absl::Status ConnectBackend(RendezvousStoreInterface& store,
                            const ReformOptions& o, const EpochKeys& keys,
                            absl::Time deadline, Reformed* out) {
  GlooBackend::Options gloo;
  gloo.store = &store;
  gloo.job_id = o.job_id;
  gloo.store_prefix = keys.Gloo();
  gloo.node_rank = out->layout.node_rank;
  gloo.num_nodes = out->layout.num_nodes;
  gloo.advertise_host = o.advertise_host;
  gloo.connect_timeout = std::max(Left(deadline), kMinStep);
  gloo.collective_timeout = o.collective_timeout;
  gloo.node_names = out->layout.NodeIds();
  // No failure probe: the next re-formation finds the lost nodes itself
  // (NodeFormationOptions::elastic).
  gloo.failure_probe_timeout = absl::ZeroDuration();
  // As FormNodeJob: bcube between two nodes (measured there).
  if (gloo.num_nodes == 2) gloo.algorithm = GlooBackend::Algorithm::kBcube;
  ASSIGN_OR_RETURN(std::unique_ptr<GlooBackend> backend,
                   GlooBackend::Create(gloo));
  out->backend = std::move(backend);
  return absl::OkStatus();
}

// One try at epoch `o.epoch`: nullopt when this node came too late for it.
absl::StatusOr<std::optional<Reformed>> EnterEpoch(
    RendezvousStoreInterface& store, const ReformOptions& o,
    absl::Time deadline) {
  const EpochKeys keys = KeysOf(o.elastic_prefix, o.epoch);
  const absl::Time entered = absl::Now();
  RETURN_IF_ERROR(store.Set(o.job_id, keys.Member(o.node_id),
                            MemberOf(o).SerializeAsString()));
  ASSIGN_OR_RETURN(int64_t slot, store.Add(o.job_id, keys.Joined(), 1));
  if (slot > kClosedBias) {
    (void)store.Delete(o.job_id, keys.Member(o.node_id));
    return std::optional<Reformed>();
  }
  RETURN_IF_ERROR(store.Set(o.job_id, keys.Slot(slot - 1), o.node_id));

  std::optional<v1::ElasticMembers> verdict;
  if (IsSurvivor(o)) {
    ASSIGN_OR_RETURN(int64_t closers, store.Add(o.job_id, keys.Closed(), 1));
    if (closers == 1) {
      ASSIGN_OR_RETURN(verdict, CloseEpoch(store, o, keys, entered, deadline));
    }
  }
  if (!verdict.has_value()) {
    ASSIGN_OR_RETURN(verdict, AwaitVerdict(store, o, keys, deadline));
  }
  ASSIGN_OR_RETURN(Reformed out, ApplyVerdict(o, keys, *verdict));
  RETURN_IF_ERROR(SharePlan(store, o, keys, deadline, &out));
  RETURN_IF_ERROR(ConnectBackend(store, o, keys, deadline, &out));
  return std::optional<Reformed>(std::move(out));
}

// A node too late for its epoch (or whose announcement an epoch settled
// without it) asks to be admitted into a later one, as an arrival that
// keeps its old offsets if they are still free. Announcing again makes the
// running nodes break for it.
absl::Status AskAgain(RendezvousStoreInterface& store, ReformOptions& o) {
  for (const JobNode& node : o.previous) {
    if (node.node_id == o.node_id) o.requested_offset = node.global_rank_offset;
  }
  o.previous.clear();
  ASSIGN_OR_RETURN(o.arrival, AnnounceArrival(store, o));
  return absl::OkStatus();
}

// Resolves epoch 0 ("the next one", but at least `floor`: "epoch" may
// not say yet that the epoch this node was too late for is closed) and an
// epoch closed already.
absl::Status ChooseEpoch(RendezvousStoreInterface& store, uint64_t floor,
                         ReformOptions& o) {
  ASSIGN_OR_RETURN(uint64_t last,
                   LastClosedEpoch(store, o.job_id, o.elastic_prefix));
  if (o.epoch != 0 && last >= o.epoch) {
    RETURN_IF_ERROR(AskAgain(store, o));
  } else if (o.epoch == 0 && o.arrival > 0) {
    const std::optional<v1::ElasticMembers> verdict =
        StoredVerdict(store, o.job_id, o.elastic_prefix, last);
    if (verdict.has_value() && verdict->arrivals_seen() >= o.arrival) {
      RETURN_IF_ERROR(AskAgain(store, o));
    }
  }
  if (o.epoch == 0 || last >= o.epoch) o.epoch = std::max(last + 1, floor);
  return absl::OkStatus();
}

}  // namespace

std::string ElasticPrefix(const std::string& round_prefix) {
  if (absl::StartsWith(round_prefix, "round")) {
    return absl::StrCat("elastic", round_prefix.substr(5));
  }
  return absl::StrCat("elastic-", round_prefix);
}

absl::Status MarkRunning(RendezvousStoreInterface& store,
                         const std::string& job_id,
                         const std::string& elastic_prefix,
                         const std::string& round_prefix) {
  return Prefixed(
      store.Set(job_id, RunningKey(elastic_prefix), round_prefix),
      absl::StrCat("marking job '", job_id, "' running elastically"));
}

absl::StatusOr<std::string> FindRunning(RendezvousStoreInterface& store,
                                        const std::string& job_id,
                                        absl::Duration timeout) {
  const std::string where =
      absl::StrCat("looking for running job '", job_id, "'");
  // A no-op that waits out a coordinator still starting (as OpenRound
  // does), so the quick probes below see the store itself.
  if (absl::StatusOr<int64_t> up = store.Add(job_id, "rounds/probe", 0);
      !up.ok()) {
    return Prefixed(up.status(), where);
  }
  // Rounds k = 1, 2, ... that were used carry a closed mark (OpenRound);
  // the newest of them with a running mark is the job's.
  std::optional<std::string> found;
  const absl::Time deadline = absl::Now() + timeout;
  for (int k = 1; absl::Now() < deadline; ++k) {
    ASSIGN_OR_RETURN(
        std::optional<std::string> closed,
        Probe(store, job_id, absl::StrCat("round", k, "/closed"), kProbe));
    if (!closed.has_value()) break;
    const std::string prefix = ElasticPrefix(absl::StrCat("round", k));
    ASSIGN_OR_RETURN(std::optional<std::string> running,
                     Probe(store, job_id, RunningKey(prefix), kProbe));
    if (running.has_value()) found = prefix;
  }
  if (!found.has_value()) {
    return absl::NotFoundError(
        absl::StrCat(where, ": it is not running elastically"));
  }
  return *found;
}

absl::StatusOr<int64_t> AnnounceArrival(RendezvousStoreInterface& store,
                                        const ReformOptions& options) {
  const std::string where = absl::StrCat("announcing node '", options.node_id,
                                         "' to job '", options.job_id, "'");
  // First under a key the coordinator checks against rendezvous.expected_
  // node_ids ("<prefix>/member/<id>", FormationNodeIdOf), so that a node it
  // would refuse is refused before the running nodes break for it.
  const std::string serialized = MemberOf(options).SerializeAsString();
  if (absl::Status s =
          store.Set(options.job_id,
                    absl::StrCat(options.elastic_prefix, "/arrival/member/",
                                 options.node_id),
                    serialized);
      !s.ok()) {
    return Prefixed(s, where);
  }
  absl::StatusOr<int64_t> n =
      store.Add(options.job_id, ArrivalsKey(options.elastic_prefix), 1);
  if (!n.ok()) return Prefixed(n.status(), where);
  if (absl::Status s = store.Set(
          options.job_id, ArrivalKey(options.elastic_prefix, *n), serialized);
      !s.ok()) {
    return Prefixed(s, where);
  }
  return *n;
}

absl::Status Beat(RendezvousStoreInterface& store, const std::string& job_id,
                  const std::string& elastic_prefix,
                  const std::string& node_id) {
  return store.Add(job_id, AliveKey(elastic_prefix, node_id), 1).status();
}

absl::Status WaitForArrival(RendezvousStoreInterface& store,
                            const std::string& job_id,
                            const std::string& elastic_prefix, int64_t next,
                            absl::Duration timeout) {
  const std::string where = absl::StrCat(
      "job '", job_id, "' waiting for arriving node number ", next);
  // The counter first: arrival keys at or below a settled number may be
  // deleted already.
  absl::StatusOr<int64_t> announced =
      store.Add(job_id, ArrivalsKey(elastic_prefix), 0);
  if (!announced.ok()) return Prefixed(announced.status(), where);
  if (*announced >= next) return absl::OkStatus();
  return Prefixed(
      store.Wait(job_id, {ArrivalKey(elastic_prefix, next)}, timeout), where);
}

absl::StatusOr<Reformed> ReformNodeJob(RendezvousStoreInterface& store,
                                       const ReformOptions& options) {
  ReformOptions o = options;
  const absl::Time deadline = absl::Now() + o.timeout;
  if (o.job_id.empty() || o.node_id.empty() || o.elastic_prefix.empty() ||
      o.local_world_size < 1 || o.min_nodes < 1 || o.max_nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(o),
                     ": job id, node id and elastic prefix are required, and "
                     "local_world_size, min_nodes and max_nodes must be >= 1"));
  }
  if (o.epoch == 0 && !o.previous.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(o), ": epoch 0 (\"the next one\") is for arrivals only"));
  }
  uint64_t floor = 1;
  while (true) {
    if (absl::Status s = ChooseEpoch(store, floor, o); !s.ok()) {
      return Prefixed(s, Where(o));
    }
    absl::StatusOr<std::optional<Reformed>> reformed =
        EnterEpoch(store, o, deadline);
    if (!reformed.ok()) return Prefixed(reformed.status(), Where(o));
    if (reformed->has_value()) return **std::move(reformed);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(Where(o), ": came too late for every epoch within ",
                       absl::FormatDuration(options.timeout)));
    }
    spdlog::info("{}: too late for it; trying a later epoch", Where(o));
    if (absl::Status s = AskAgain(store, o); !s.ok()) {
      return Prefixed(s, Where(o));
    }
    floor = o.epoch + 1;
    o.epoch = 0;
  }
}

}  // namespace gradd
