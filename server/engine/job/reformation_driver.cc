#include "server/engine/job/reformation_driver.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/logging.h"

namespace gradd {

ReformationDriver::ReformationDriver(Options options, Parts parts,
                                     absl::AnyInvocable<void()> wake)
    : options_(std::move(options)),
      parts_(std::move(parts)),
      epoch_(options_.enabled, options_.bucket_divisor),
      inbox_(std::move(wake)) {}

bool ReformationDriver::Step() {
  // A request taken while a break is under way (draining or re-forming)
  // is dropped: the only caller is the arrival watcher (JobManager), which
  // asks again, once the re-formation is over, for an arrival that the new
  // membership did not settle; keeping the request re-formed the job once
  // more, with the same members, when it had.
  ReformationInbox::Taken taken = inbox_.Take();
  if (taken.result.has_value()) {
    if (epoch_.TakeResult()) {
      if (!Apply(*std::move(taken.result))) return true;
    } else {
      spdlog::warn(
          "job '{}': a re-formation result arrived while none was under "
          "way; ignored",
          options_.job_id);
    }
  }
  if (epoch_.running()) {
    if (taken.error.has_value()) {
      if (!BeginDraining(*std::move(taken.error))) return true;
    } else if (taken.request.has_value()) {
      if (!BeginDraining(*std::move(taken.request))) return true;
    }
  }
  const bool draining = epoch_.stage() == EpochState::Stage::kDraining;
  if (draining && parts_.hand_overs->count() != 0) {
    // What is with the old reducer may never complete by itself: its
    // network order can wait for a bucket this node will never hand over
    // (a rank died in the middle of its backward, and the break is this
    // node's own, so no peer fails it). Stopping the old reducer completes
    // everything queued with CANCELLED (its destructor; a collective
    // running now ends first, bounded by the collective timeout) and
    // closes its backend, so the peers blocked on this node fail at once.
    parts_.reducer->Replace(nullptr);
  }
  if (!epoch_.Drained(parts_.hand_overs->count())) return epoch_.under_way();
  HandOver();
  return true;
}

void ReformationDriver::RanksReturned(
    std::vector<RankRestartInbox::Request> returned) {
  if (returned.empty()) return;
  const std::string reason =
      absl::StrCat("local rank ", returned.front().rank, " restarted");
  for (RankRestartInbox::Request& r : returned) {
    returned_.push_back(std::move(r));
  }
  if (epoch_.running()) BeginDraining(reason);
}

void ReformationDriver::FailReturnedRanks(const absl::Status& status) {
  std::vector<RankRestartInbox::Request> batch;
  batch.swap(returned_);
  for (RankRestartInbox::Request& r : batch) std::move(r.done)(status);
}

void ReformationDriver::Close(const absl::Status& status) {
  FailReturnedRanks(status);
  inbox_.Close();
}

bool ReformationDriver::BeginDraining(std::string reason) {
  const std::string in_play = EpochState::Unsurvivable(
      parts_.job->JoinInPlay(), parts_.plan_switch->in_play());
  if (!in_play.empty()) {
    parts_.job->FailJob(absl::StrCat(
        "job '", options_.job_id, "': the inter-node group broke (", reason,
        ") while ", in_play,
        "; elastic re-formation does not run during a "
        "join or a bucket rebuild"));
    return false;
  }
  if (!epoch_.Break(std::move(reason), parts_.now_ns())) return true;
  parts_.hand_overs->SetDraining(true);
  parts_.job->EnterPhase(JobPhase::kDraining, epoch_.reason());
  // What this node saw, not yet what it was (a peer's connection reset may
  // be its death or its rank restart): the "re-formed" line says that,
  // from the closer's verdict, the same on every node.
  spdlog::info(
      "job '{}': its nodes' group broke at epoch {} (this node saw: {}); "
      "draining, then re-forming",
      options_.job_id, parts_.job->ReadControl().epoch, epoch_.reason());
  return true;
}

bool ReformationDriver::HandOver() {
  // Drained: nothing is with the reducer, and nothing will be.
  ReformationRequest broken = parts_.job->ReadControl();
  broken.reason = epoch_.reason();
  for (const RankRestartInbox::Request& r : returned_) {
    broken.restarted_local_ranks.push_back(r.rank);
  }
  NetworkReformEvent e;
  e.epoch = broken.epoch;
  e.reason = epoch_.reason();
  e.broke_ns = epoch_.broke_ns();
  e.at_ns = epoch_.broke_ns();
  parts_.events->OnNetworkBroken(e);
  // The old group is done with: closing its backend tells the peers still
  // blocked on this node at once (a break this node started has not
  // reached them yet).
  parts_.reducer->Replace(nullptr);
  parts_.job->EnterPhase(JobPhase::kReforming,
                         absl::StrCat("drained, iteration ",
                                      broken.completed_iteration, " complete"));
  if (!handler_) {
    parts_.job->FailJob(absl::StrCat(
        "job '", options_.job_id, "': the inter-node group broke (",
        epoch_.reason(), ") and nothing re-forms it"));
    return false;
  }
  spdlog::debug(
      "job '{}': drained after the break (iteration {} complete); "
      "re-forming",
      options_.job_id, broken.completed_iteration);
  handler_(std::move(broken));
  return true;
}

bool ReformationDriver::Apply(absl::StatusOr<ReformationResult> result) {
  auto fail = [&](absl::string_view why) {
    const std::string message = absl::StrCat(
        "job '", options_.job_id, "': re-formation after the break (",
        epoch_.reason(), ") failed: ", why);
    parts_.job->FailJob(message);
    // Every rank waiting to come back learns why.
    const absl::Status status = absl::AbortedError(message);
    FailReturnedRanks(status);
    parts_.restarts->FailAll(status);
    return false;
  };
  if (!result.ok()) return fail(result.status().message());
  ReformationResult& r = *result;
  if (r.reducer == nullptr) return fail("no reducer for the new group");
  parts_.reducer->Replace(std::move(r.reducer));
  // What the re-formation was: the closer's line (this node's own view of
  // the break only when the result carries none).
  const std::string what = r.reason.empty() ? epoch_.reason() : r.reason;
  PublishedState::Layout live = parts_.published->layout();
  live.node_rank = r.node_rank;
  live.num_nodes = r.num_nodes;
  live.world_size = r.world_size;
  live.node_ids = r.node_ids;
  // With a known cause, the closer's list, the same on every node (an
  // admitted node's too); else this node's list, moved by the lost and
  // admitted ones.
  EpochState::Membership m;
  m.cause_known = r.cause != ReformCause::kUnknown;
  m.departed = r.departed;
  m.lost = r.lost;
  m.admitted = r.admitted;
  live.lost = EpochState::LostAfter(std::move(live.lost), m);
  live.last_reason = what;
  std::vector<std::string> lost_now = live.lost;  // every node lost, not back
  parts_.published->SetLayout(std::move(live));
  // The new reducer divides by the live world size; a job that divides by
  // the initial one says so per bucket.
  epoch_.SetWorld(
      EpochState::MembershipChanged(r.node_ids, options_.formed_node_ids,
                                    r.world_size, options_.formed_world_size),
      EpochState::BucketDivisor(options_.divide_by_initial_world_size,
                                options_.initial_world_size));
  const RankRestarts::Aborted abort = parts_.job->StartNewGroup(r);

  const int64_t now = parts_.now_ns();
  NetworkReformEvent e;
  e.epoch = r.epoch;
  e.reason = what;
  e.cause = r.cause;
  e.broke_ns = epoch_.broke_ns();
  e.at_ns = now;
  e.lost = r.lost;
  e.admitted = r.admitted;
  e.node_ids = r.node_ids;
  e.lost_node_ids = std::move(lost_now);
  e.num_nodes = r.num_nodes;
  e.world_size = r.world_size;
  e.aborted_iteration = abort.iteration;
  e.aborted_round = abort.round;
  parts_.events->OnNetworkReformed(e);
  // The one line that says what the re-formation was (the closer's words,
  // the same on every node): a warning when a node was lost.
  spdlog::log(
      r.cause == ReformCause::kNodeLost ? spdlog::level::warn
                                        : spdlog::level::info,
      "{}",
      absl::StrCat(
          "job '", options_.job_id, "' re-formed (epoch ", r.epoch, ") after ",
          epoch_.ElapsedMs(now), " ms: ", what, " (", ReformCauseName(r.cause),
          "); node rank ", r.node_rank, " of ", r.num_nodes, ", world size ",
          r.world_size,
          r.lost.empty() ? std::string()
                         : absl::StrCat(", lost ", absl::StrJoin(r.lost, ", ")),
          r.admitted.empty()
              ? std::string()
              : absl::StrCat(", admitted ", absl::StrJoin(r.admitted, ", ")),
          abort.iteration != 0
              ? absl::StrCat("; aborted iteration ", abort.iteration,
                             ", goes on at iteration ", abort.last + 1)
              : std::string(),
          "; aborted collective round ", abort.round, "; state sync ",
          r.sync_seq, r.behind ? " (this node is behind)" : ""));

  epoch_.Resume();
  parts_.hand_overs->SetDraining(false);
  parts_.job->EnterPhase(JobPhase::kRunning,
                         absl::StrCat("re-formed at epoch ", r.epoch));

  // The ranks whose return caused or met this break: the re-formation's
  // abort and agreed sync_seq are theirs too.
  for (RankRestartInbox::Request& request : parts_.restarts->TakeAll()) {
    returned_.push_back(std::move(request));
  }
  std::vector<RankRestartInbox::Request> batch;
  batch.swap(returned_);
  for (RankRestartInbox::Request& request : batch) {
    parts_.job->RankBack(std::move(request), abort, r);
  }
  return true;
}

}  // namespace gradd
