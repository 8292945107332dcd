#include "server/rendezvous/job_formation.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gradd/v1/rendezvous.pb.h"

namespace gradd {
namespace {

std::string Shape(const v1::ParamSpec& p) {
  return absl::StrCat("[", absl::StrJoin(p.shape(), ", "), "]");
}

std::string Describe(const v1::ParamSpec& p) {
  return absl::StrCat(Shape(p), " ", v1::DType_Name(p.dtype()));
}

absl::Status WithContext(const absl::Status& s, const std::string& context) {
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace

std::optional<std::string> FormationNodeIdOf(absl::string_view key,
                                             absl::string_view value) {
  // "<prefix>/member/<id>": the first "/member/" ends the prefix (node ids
  // may contain '/'; the daemons' prefixes never contain "/member/").
  if (size_t at = key.find("/member/");
      at != absl::string_view::npos && at > 0) {
    absl::string_view id = key.substr(at + sizeof("/member/") - 1);
    if (!id.empty()) return std::string(id);
    return std::nullopt;
  }
  // "<prefix>/slot/<i>".
  if (size_t at = key.rfind("/slot/");
      at != absl::string_view::npos && at > 0) {
    absl::string_view index = key.substr(at + sizeof("/slot/") - 1);
    if (!index.empty() &&
        std::all_of(index.begin(), index.end(), absl::ascii_isdigit)) {
      return std::string(value);
    }
  }
  return std::nullopt;
}

std::vector<std::string> JobLayout::NodeIds() const {
  std::vector<std::string> ids;
  for (const JobNode& node : nodes) ids.push_back(node.node_id);
  return ids;
}

std::optional<std::string> DescribeFingerprintMismatch(
    const std::vector<v1::ParamSpec>& a, const std::string& a_node,
    const std::vector<v1::ParamSpec>& b, const std::string& b_node) {
  const size_t common = std::min(a.size(), b.size());
  for (size_t i = 0; i < common; ++i) {
    const v1::ParamSpec& pa = a[i];
    const v1::ParamSpec& pb = b[i];
    if (pa.name() != pb.name()) {
      return absl::StrCat("parameter #", i, " is '", pa.name(), "' on node '",
                          a_node, "' but '", pb.name(), "' on node '", b_node,
                          "'");
    }
    if (pa.dtype() != pb.dtype() ||
        !std::equal(pa.shape().begin(), pa.shape().end(), pb.shape().begin(),
                    pb.shape().end())) {
      return absl::StrCat("parameter '", pa.name(), "' (#", i, ") is ",
                          Describe(pa), " on node '", a_node, "' but ",
                          Describe(pb), " on node '", b_node, "'");
    }
  }
  if (a.size() != b.size()) {
    const bool a_longer = a.size() > b.size();
    const v1::ParamSpec& extra = a_longer ? a[common] : b[common];
    return absl::StrCat(
        "node '", a_node, "' has ", a.size(), " parameters but node '", b_node,
        "' has ", b.size(), "; parameter '", extra.name(), "' (#", common,
        ") exists only on node '", a_longer ? a_node : b_node, "'");
  }
  return std::nullopt;
}

absl::StatusOr<JobLayout> FormJob(RendezvousStoreInterface& store,
                                  const JobFormationOptions& options) {
  const std::string& job = options.job_id;
  const std::string where =
      absl::StrCat("forming job '", job, "' on node '", options.node_id, "'");
  if (job.empty() || options.node_id.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": job id and node id are required"));
  }
  if (options.num_nodes < 1 || options.local_world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": num_nodes (", options.num_nodes, ") and local_world_size (",
        options.local_world_size, ") must be >= 1"));
  }
  if (options.node_rank.has_value() &&
      (*options.node_rank < 0 || *options.node_rank >= options.num_nodes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": node rank ", *options.node_rank, " outside [0, ",
                     options.num_nodes, ")"));
  }
  if (options.prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": empty formation prefix"));
  }
  const std::vector<std::string>& expected = options.expected_node_ids;
  auto is_expected = [&](const std::string& id) {
    return expected.empty() ||
           std::find(expected.begin(), expected.end(), id) != expected.end();
  };
  if (!is_expected(options.node_id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": this node's id is not in rendezvous.expected_node_ids (",
        absl::StrJoin(expected, ", "), ")"));
  }
  const std::string& p = options.prefix;
  const int n = options.num_nodes;
  const absl::Time deadline = absl::Now() + options.timeout;
  auto slot_key = [&](int i) { return absl::StrCat(p, "/slot/", i); };
  auto member_key = [&](const std::string& id) {
    return absl::StrCat(p, "/member/", id);
  };

  // 1. Publish who we are, then take an arrival slot.
  v1::JobMember me;
  me.set_node_id(options.node_id);
  me.set_requested_node_rank(options.node_rank.value_or(-1));
  me.set_local_world_size(options.local_world_size);
  me.set_num_nodes(n);
  for (const v1::ParamSpec& param : options.params) *me.add_params() = param;
  if (absl::Status s =
          store.Set(job, member_key(options.node_id), me.SerializeAsString());
      !s.ok()) {
    return WithContext(s, where);
  }
  absl::StatusOr<int64_t> slot = store.Add(job, absl::StrCat(p, "/joined"), 1);
  if (!slot.ok()) return WithContext(slot.status(), where);
  if (*slot > n) {
    // A restarted node may come back into a formed round; anyone else is
    // one node too many.
    bool already_in = false;
    for (int i = 0; i < n && !already_in; ++i) {
      absl::StatusOr<std::string> id =
          store.Get(job, slot_key(i), absl::Milliseconds(200));
      already_in = id.ok() && *id == options.node_id;
    }
    if (!already_in) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": the job already has its ", n,
                       " nodes; this node is number ", *slot));
    }
  } else if (absl::Status s =
                 store.Set(job, slot_key(*slot - 1), options.node_id);
             !s.ok()) {
    return WithContext(s, where);
  }

  // 2. Wait for everyone.
  std::vector<std::string> slot_keys;
  for (int i = 0; i < n; ++i) slot_keys.push_back(slot_key(i));
  if (absl::Status s =
          store.Wait(job, slot_keys,
                     std::max(deadline - absl::Now(), absl::Milliseconds(1)));
      !s.ok()) {
    if (s.code() != absl::StatusCode::kDeadlineExceeded) {
      return WithContext(s, where);
    }
    std::vector<std::string> arrived;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::string> id =
          store.Get(job, slot_keys[i], absl::Milliseconds(200));
      if (id.ok()) arrived.push_back(*id);
    }
    std::sort(arrived.begin(), arrived.end());
    std::string missing;
    if (!options.expected_node_ids.empty()) {
      std::vector<std::string> ids;
      for (const std::string& id : options.expected_node_ids) {
        if (!std::binary_search(arrived.begin(), arrived.end(), id)) {
          ids.push_back(id);
        }
      }
      missing = absl::StrCat("missing: ", absl::StrJoin(ids, ", "));
    } else {
      missing = absl::StrCat("missing ", n - static_cast<int>(arrived.size()),
                             " node(s) whose ids are not configured");
    }
    return absl::DeadlineExceededError(absl::StrCat(
        where, ": only ", arrived.size(), " of ", n, " nodes joined within ",
        absl::FormatDuration(options.timeout), " (",
        absl::StrJoin(arrived, ", "), "); ", missing));
  }

  // 3. Read everyone's membership.
  std::vector<v1::JobMember> members;
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<std::string> id =
        store.Get(job, slot_keys[i], absl::Seconds(5));
    if (!id.ok()) return WithContext(id.status(), where);
    if (!is_expected(*id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": node '", *id,
          "' joined but is not in rendezvous.expected_node_ids (",
          absl::StrJoin(expected, ", "), "); refusing to form with it"));
    }
    if (!seen.insert(*id).second) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": node id '", *id,
                       "' joined twice; node ids must be unique"));
    }
    absl::StatusOr<std::string> blob =
        store.Get(job, member_key(*id), absl::Seconds(5));
    if (!blob.ok()) return WithContext(blob.status(), where);
    v1::JobMember member;
    if (!member.ParseFromString(*blob)) {
      return absl::InternalError(
          absl::StrCat(where, ": unreadable membership of node '", *id, "'"));
    }
    if (member.num_nodes() != n) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": node '", *id, "' expects ", member.num_nodes(),
                       " nodes, node '", options.node_id, "' expects ", n));
    }
    members.push_back(std::move(member));
  }

  // 4. Node ranks: explicit first, the rest by sorted node id.
  std::vector<const v1::JobMember*> by_rank(n, nullptr);
  std::vector<const v1::JobMember*> unranked;
  for (const v1::JobMember& m : members) {
    const int r = m.requested_node_rank();
    if (r < 0) {
      unranked.push_back(&m);
      continue;
    }
    if (r >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": node '", m.node_id(), "' asks for node rank ",
                       r, " outside [0, ", n, ")"));
    }
    if (by_rank[r] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": nodes '", by_rank[r]->node_id(), "' and '",
                       m.node_id(), "' both ask for node rank ", r));
    }
    by_rank[r] = &m;
  }
  std::sort(unranked.begin(), unranked.end(),
            [](const v1::JobMember* a, const v1::JobMember* b) {
              return a->node_id() < b->node_id();
            });
  auto next = unranked.begin();
  for (int r = 0; r < n; ++r) {
    if (by_rank[r] == nullptr) by_rank[r] = *next++;
  }

  JobLayout layout;
  layout.num_nodes = n;
  int offset = 0;
  for (int r = 0; r < n; ++r) {
    const v1::JobMember& m = *by_rank[r];
    layout.nodes.push_back(
        JobNode{m.node_id(), r, m.local_world_size(), offset});
    if (m.node_id() == options.node_id) {
      layout.node_rank = r;
      layout.global_rank_offset = offset;
    }
    offset += m.local_world_size();
  }
  layout.world_size = offset;

  // 5. Everyone's model must match node rank 0's.
  const std::vector<v1::ParamSpec> reference(by_rank[0]->params().begin(),
                                             by_rank[0]->params().end());
  for (int r = 1; r < n; ++r) {
    const std::vector<v1::ParamSpec> other(by_rank[r]->params().begin(),
                                           by_rank[r]->params().end());
    std::optional<std::string> mismatch = DescribeFingerprintMismatch(
        reference, by_rank[0]->node_id(), other, by_rank[r]->node_id());
    if (mismatch.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": model mismatch between nodes: ", *mismatch));
    }
  }
  return layout;
}

}  // namespace gradd
