// The engine's side of node loss and arrival (job.h "Elastic multi-node
// jobs"; common/control_block.h "Re-formation"): where the current
// re-formation of a multi-node job's inter-node group stands, why and when
// it began, and the rules for what the job looks like after it.
//
//   running --Break(reason, now)--> draining --Drained(in flight 0)-->
//   reforming --TakeResult()--> (Job applies it) --Resume()--> running
//
// A break while one is under way is absorbed (the first reason stays); a
// result that arrives while none is under way is not taken. Failures are
// Job's (it fails the job and stops asking).
//
// Pure logic, owned by the engine thread: no threads, no I/O. Time is
// passed in (engine clock, ns). Job keeps what other threads leave word in
// (reformation_inbox.h) and feeds it here.
#ifndef GRADD_SERVER_ENGINE_JOB_EPOCH_STATE_H_
#define GRADD_SERVER_ENGINE_JOB_EPOCH_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace gradd {

class EpochState {
 public:
  enum class Stage { kRunning, kDraining, kReforming };

  // `enabled`: the job survives node loss and arrival (JobSpec: num_nodes >
  // 1 and min_nodes > 0 or a rank restart grace). A disabled one never
  // leaves kRunning.
  // `bucket_divisor`: see bucket_divisor() (BucketDivisor of a node
  // admitted into its running job; 0 for a job formed afresh).
  explicit EpochState(bool enabled, double bucket_divisor = 0)
      : enabled_(enabled), bucket_divisor_(bucket_divisor) {}

  bool enabled() const { return enabled_; }
  Stage stage() const { return stage_; }
  bool running() const { return stage_ == Stage::kRunning; }
  // Draining or reforming: the engine starts nothing new.
  bool under_way() const { return stage_ != Stage::kRunning; }

  // Why a break cannot be survived now: empty when it can, else what is in
  // play ("a join (uneven inputs) is in play" / "a bucket rebuild is
  // pending"): a join epoch counts and divides by the ranks of every node
  // and a plan switch agrees across the old group, so neither survives a
  // new one.
  static std::string Unsurvivable(bool join_in_play, bool plan_switch_pending);

  // running -> draining for `reason`, seen at `now_ns`. False (nothing
  // changes) when not enabled or a re-formation is under way already.
  bool Break(std::string reason, int64_t now_ns);
  // draining -> reforming once nothing is with the reducer (`in_flight`
  // hand-overs whose completion has not run). False otherwise.
  bool Drained(int in_flight);
  // A re-formation result arrived: true (apply it) when one is under way
  // and the group is re-forming; false: none was asked for, ignore it.
  bool TakeResult() const { return stage_ == Stage::kReforming; }
  // reforming -> running, once the result is applied.
  void Resume();

  // What plain buckets divide by (BucketWork::divisor): 0, the reducer's
  // own (the live world size), or the job's initial world size when the
  // job divides by it and its world may differ from it (after a
  // re-formation, and from the start on a node admitted into its running
  // job).
  double bucket_divisor() const { return bucket_divisor_; }
  // The job runs on other nodes than it formed with (a node lost or
  // admitted and not back): join rounds and the collectives laid out by
  // global rank assume the initial rank set and fail clearly instead.
  bool membership_changed() const { return membership_changed_; }
  // What a re-formation made of the two above.
  void SetWorld(bool membership_changed, double bucket_divisor) {
    membership_changed_ = membership_changed;
    bucket_divisor_ = bucket_divisor;
  }
  // The divisor rule: the initial world size when the job divides by it
  // and it is known (> 0), else 0.
  static double BucketDivisor(bool divide_by_initial, int initial_world_size) {
    return divide_by_initial && initial_world_size > 0
               ? static_cast<double>(initial_world_size)
               : 0;
  }

  // The current (or last) break: what this node saw and when.
  const std::string& reason() const { return reason_; }
  int64_t broke_ns() const { return broke_ns_; }
  // Since the break, in ms (0 before any).
  int64_t ElapsedMs(int64_t now_ns) const;

  // What a re-formation result says of the job's nodes, applied to what
  // this node knew (`lost_before`: every node lost and not back).
  struct Membership {
    // The closer said what the re-formation was (not kUnknown): its
    // `departed` list is the whole truth, the same on every node.
    bool cause_known = false;
    std::vector<std::string> departed;
    // An older closer: the nodes lost and admitted by this re-formation.
    std::vector<std::string> lost;
    std::vector<std::string> admitted;
  };
  // Every node lost and not back after the re-formation: `departed` when
  // the cause is known; else lost_before plus `lost` (once each) less
  // `admitted` (a lost node taken back is live).
  static std::vector<std::string> LostAfter(
      std::vector<std::string> lost_before, const Membership& m);
  // The job runs on other nodes than it formed with: its live node ids
  // (any order) or world size differ from the initial ones.
  static bool MembershipChanged(std::vector<std::string> node_ids,
                                std::vector<std::string> initial_node_ids,
                                int world_size, int initial_world_size);

 private:
  const bool enabled_;
  Stage stage_ = Stage::kRunning;
  std::string reason_;
  int64_t broke_ns_ = 0;
  double bucket_divisor_ = 0;
  bool membership_changed_ = false;
};

}  // namespace gradd

#endif  // GRADD_SERVER_ENGINE_JOB_EPOCH_STATE_H_
