// The verdict of a re-formation's epoch (reformation_verdict.h): a pure
// function of what the deciding node read.
#include "server/engine/formation/reformation_verdict.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/formation/node_formation.h"

namespace gradd::reformation_internal {
namespace {

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
    for (int r : m->restarted_local_ranks()) {
      rejoined.push_back(
          absl::StrCat("local rank ", r, " of node '", m->node_id(), "'"));
    }
    // What the survivors saw (an arrival's "asks to be admitted" is said
    // by the admission itself).
    if (m->restarted_local_ranks().empty() && !m->reason().empty() &&
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

}  // namespace

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

}  // namespace gradd::reformation_internal
