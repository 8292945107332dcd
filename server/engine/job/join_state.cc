#include "server/engine/job/join_state.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/control_block.h"

namespace gradd {
namespace {

constexpr size_t kIterationAt = 0;
constexpr size_t kDivideAt = 1;
constexpr size_t kThrowAt = 2;
constexpr size_t kNodesAt = 3;
constexpr size_t kRanksAt = 4;
// A rank's entry in the round is sync_bytes + 1 carried as a double: exact
// only below 2^53. A larger sync_bytes (a rogue rank block) is refused
// rather than rounded, and a summed entry past 2^53 (a peer daemon sending
// inf or garbage) is refused before its conversion to an integer.
constexpr uint64_t kMaxSyncBytes = (uint64_t{1} << 53) - 2;
constexpr double kMaxRankEntry = 9007199254740992.0;  // 2^53

std::string Options(uint32_t flags) {
  return absl::StrCat(
      "divide_by_initial_world_size=",
      (flags & kJoinDivideByInitialWorldSize) ? "True" : "False",
      ", throw_on_early_termination=",
      (flags & kJoinThrowOnEarlyTermination) ? "True" : "False");
}

}  // namespace

JoinState::JoinState(std::string job_id, int local_world_size,
                     int global_rank_offset, int world_size, int num_nodes)
    : job_id_(std::move(job_id)),
      local_world_(local_world_size),
      offset_(global_rank_offset),
      world_size_(world_size),
      num_nodes_(num_nodes) {}

std::string JoinState::RankName(int local_rank) const {
  return absl::StrCat("local rank ", local_rank, " (global rank ",
                      offset_ + local_rank, ") of job '", job_id_, "'");
}

absl::StatusOr<std::vector<double>> JoinState::Poll(
    const std::vector<JoinRankView>& ranks, uint64_t next_iteration) {
  if (phase_ == Phase::kRound || phase_ == Phase::kRunning) {
    return std::vector<double>();
  }
  if (phase_ == Phase::kOff) {
    const uint64_t next_join = done_join_seq_ + 1;
    int opener = -1;
    for (int r = 0; r < local_world_; ++r) {
      if (ranks[r].join_seq > next_join) {
        return absl::FailedPreconditionError(
            absl::StrCat(RankName(r), " entered join mode ", ranks[r].join_seq,
                         " while join ", next_join, " is the next one"));
      }
      if (ranks[r].join_seq == next_join && opener < 0) opener = r;
    }
    if (opener < 0) return std::vector<double>();
    const JoinRankView& first = ranks[opener];
    for (int r = 0; r < local_world_; ++r) {
      const JoinRankView& v = ranks[r];
      if (v.join_seq != next_join) {
        if (!v.live) {
          return absl::AbortedError(
              absl::StrCat(RankName(r), " left before entering join mode (",
                           RankName(opener), " entered it before iteration ",
                           first.begin, ")"));
        }
        if (v.published) {
          return absl::FailedPreconditionError(absl::StrCat(
              RankName(r), " started iteration ", next_iteration,
              " without entering join mode, but ", RankName(opener),
              " entered it before iteration ", first.begin,
              "; every rank must enter join() before the same iteration"));
        }
        return std::vector<double>();  // not there yet
      }
      if (v.begin != first.begin || v.flags != first.flags) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ranks disagree on join: ", RankName(opener),
            " entered it before iteration ", first.begin, " with ",
            Options(first.flags), "; ", RankName(r), " before iteration ",
            v.begin, " with ", Options(v.flags)));
      }
    }
    if (first.begin != next_iteration) {
      return absl::FailedPreconditionError(absl::StrCat(
          RankName(opener), " entered join mode before iteration ", first.begin,
          " while iteration ", next_iteration, " is next"));
    }
    join_seq_ = next_join;
    iteration_ = first.begin;
    flags_ = first.flags;
    last_max_active_ = world_size_ - 1;
    phase_ = Phase::kCollecting;
  }

  // kCollecting: every rank must be decided for iteration_.
  std::vector<double> round(round_size(), 0.0);
  round_local_active_.assign(local_world_, false);
  for (int r = 0; r < local_world_; ++r) {
    const JoinRankView& v = ranks[r];
    if (!v.live) {
      return absl::AbortedError(
          absl::StrCat(RankName(r), " left during join, at iteration ",
                       iteration_, "; the job cannot continue"));
    }
    const bool joined = v.joined_at != 0;
    if (joined && v.joined_at > iteration_) {
      return absl::FailedPreconditionError(
          absl::StrCat(RankName(r), " joined from iteration ", v.joined_at,
                       " while iteration ", iteration_, " is in progress"));
    }
    if (joined && v.active_seq >= v.joined_at) {
      return absl::FailedPreconditionError(absl::StrCat(
          RankName(r), " declared itself active in iteration ", v.active_seq,
          " but joined from iteration ", v.joined_at));
    }
    const bool active = !joined && v.active_seq >= iteration_;
    if (!joined && !active) return std::vector<double>();  // undecided
    if (active && v.sync_bytes > kMaxSyncBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(RankName(r), " asks for a join sync of ", v.sync_bytes,
                       " bytes in iteration ", iteration_, "; the limit is ",
                       kMaxSyncBytes));
    }
    round_local_active_[r] = active;
    round[kRanksAt + offset_ + r] =
        active ? static_cast<double>(v.sync_bytes) + 1.0 : -1.0;
  }
  round[kIterationAt] = static_cast<double>(iteration_);
  round[kDivideAt] = (flags_ & kJoinDivideByInitialWorldSize) ? 1.0 : 0.0;
  round[kThrowAt] = (flags_ & kJoinThrowOnEarlyTermination) ? 1.0 : 0.0;
  round[kNodesAt] = 1.0;
  phase_ = Phase::kRound;
  return round;
}

absl::StatusOr<JoinState::Outcome> JoinState::Resolve(
    const std::vector<double>& summed) {
  if (phase_ != Phase::kRound) {
    return absl::InternalError(
        absl::StrCat("job '", job_id_, "': join round result outside a round"));
  }
  if (summed.size() != round_size()) {
    return absl::InternalError(
        absl::StrCat("job '", job_id_, "': join round of ", summed.size(),
                     " values, ", round_size(), " expected"));
  }
  const double nodes = num_nodes_;
  const bool divide = flags_ & kJoinDivideByInitialWorldSize;
  const bool throws = flags_ & kJoinThrowOnEarlyTermination;
  if (summed[kNodesAt] != nodes ||
      summed[kIterationAt] != nodes * static_cast<double>(iteration_) ||
      summed[kDivideAt] != (divide ? nodes : 0.0) ||
      summed[kThrowAt] != (throws ? nodes : 0.0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id_,
        "': the nodes disagree on join: this node is at "
        "iteration ",
        iteration_, " with ", Options(flags_),
        " (every rank of every node must enter join() before the same "
        "iteration with the same options)"));
  }
  Outcome out;
  out.iteration = iteration_;
  int min_joined = -1;
  uint64_t sync_bytes = 0;
  int sync_from = -1;
  for (int g = 0; g < world_size_; ++g) {
    const double v = summed[kRanksAt + g];
    if (v == -1.0) {
      if (min_joined < 0) min_joined = g;
      continue;
    }
    if (!(v >= 1.0 && v <= kMaxRankEntry) || v != std::floor(v)) {
      return absl::InternalError(
          absl::StrCat("job '", job_id_, "': join round: global rank ", g,
                       " reported as ", v, " (no node, or several, hold it)"));
    }
    const uint64_t bytes = static_cast<uint64_t>(v) - 1;
    if (sync_from >= 0 && bytes != sync_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", job_id_, "': ranks disagree on the join sync at iteration ",
          iteration_, ": global rank ", sync_from, " syncs ", sync_bytes,
          " bytes, global rank ", g, " ", bytes, " bytes"));
    }
    sync_bytes = bytes;
    sync_from = g;
    ++out.global_active;
    out.max_active = g;
  }
  // As torch: a rank that runs out throws only if others still have inputs;
  // ranks that all run out together end the join normally.
  if (throws && min_joined >= 0 && out.global_active > 0) {
    out.kind = Kind::kThrown;
    out.exhausted_rank = min_joined;
  } else if (out.global_active == 0) {
    out.kind = Kind::kComplete;
    out.authoritative_rank = last_max_active_;
  } else {
    out.kind = Kind::kContinue;
    out.divisor = divide ? world_size_ : out.global_active;
    out.sync_bytes = sync_bytes;
    out.local_active = round_local_active_;
  }
  if (out.kind == Kind::kContinue) {
    phase_ = Phase::kRunning;
  } else {
    phase_ = Phase::kOff;
    done_join_seq_ = join_seq_;
  }
  current_ = out;
  return out;
}

void JoinState::IterationDone() {
  if (phase_ != Phase::kRunning) return;
  last_max_active_ = current_.max_active;
  ++iteration_;
  phase_ = Phase::kCollecting;
}

}  // namespace gradd
