// ReformationDriver driven by hand: a fake job side records what the
// driver asks of the job, a fake clock says when, and the test plays the
// reducer's completions, the re-formation handler and the engine's loop
// (Step). No Job, no control block, no threads.
#include "server/engine/job/reformation_driver.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/job/counted_reducer.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class FakeJobSide final : public ReformationDriver::JobSide {
 public:
  bool JoinInPlay() override { return join_in_play; }
  void EnterPhase(JobPhase next, absl::string_view why) override {
    if (phase == JobPhase::kFailed) return;
    phase = next;
    phases.push_back(std::string(JobPhaseName(next)));
  }
  void FailJob(absl::string_view message) override {
    failure = std::string(message);
    EnterPhase(JobPhase::kFailed, message);
  }
  ReformationRequest ReadControl() override {
    ReformationRequest r;
    r.completed_iteration = completed;
    r.sync_seq = sync_seq;
    r.epoch = epoch;
    return r;
  }
  RankRestarts::Aborted StartNewGroup(const ReformationResult& r) override {
    ++new_groups;
    epoch = r.epoch;
    sync_seq = r.sync_seq;
    RankRestarts::Aborted a;
    a.iteration = completed + 1;
    a.last = completed + 1;
    a.round = 4;
    return a;
  }
  void RankBack(RankRestartInbox::Request request,
                const RankRestarts::Aborted& abort,
                const ReformationResult& r) override {
    back.push_back(request.rank);
    v1::AttachResponse response;
    response.set_next_iteration(abort.last + 1);
    response.set_sync_seq(r.sync_seq);
    std::move(request.done)(std::move(response));
  }

  bool join_in_play = false;
  uint64_t completed = 7;
  uint64_t sync_seq = 3;
  uint64_t epoch = 0;
  JobPhase phase = JobPhase::kRunning;
  std::vector<std::string> phases;
  std::optional<std::string> failure;
  int new_groups = 0;
  std::vector<int> back;
};

class RecordingEvents final : public JobEventSinkInterface {
 public:
  void OnNetworkBroken(const NetworkReformEvent& e) override {
    broken.push_back(e);
  }
  void OnNetworkReformed(const NetworkReformEvent& e) override {
    reformed.push_back(e);
  }
  std::vector<NetworkReformEvent> broken;
  std::vector<NetworkReformEvent> reformed;
};

class ReformationDriverTest : public ::testing::Test {
 protected:
  ReformationDriverTest() { Make(/*enabled=*/true); }

  void Make(bool enabled) {
    ReformationDriver::Options o;
    o.job_id = "j";
    o.enabled = enabled;
    o.formed_node_ids = {"a", "b"};
    o.formed_world_size = 4;
    o.initial_world_size = 4;
    ReformationDriver::Parts p;
    p.job = &job_;
    p.reducer = &reducer_;
    p.hand_overs = &hand_overs_;
    p.plan_switch = &switches_;
    p.restarts = &restarts_;
    p.published = &published_;
    p.events = &events_;
    p.now_ns = [this] { return now_ns_; };
    driver_ = std::make_unique<ReformationDriver>(std::move(o), std::move(p),
                                                  [this] { ++wakes_; });
    driver_->SetHandler(
        [this](ReformationRequest r) { requests_.push_back(std::move(r)); });
  }

  ReformationResult Result(uint64_t epoch) {
    ReformationResult r;
    r.reducer = std::make_unique<CountedReducer>(&destroyed_);
    r.epoch = epoch;
    r.node_rank = 0;
    r.num_nodes = 1;
    r.world_size = 2;
    r.node_ids = {"a"};
    r.sync_seq = 9;
    r.cause = ReformCause::kNodeLost;
    r.reason = "node 'b' lost";
    r.departed = {"b"};
    r.lost = {"b"};
    return r;
  }

  static PublishedState::Layout Formed() {
    PublishedState::Layout l;
    l.num_nodes = 2;
    l.world_size = 4;
    l.node_ids = {"a", "b"};
    return l;
  }

  FakeJobSide job_;
  std::atomic<int> destroyed_{0};
  ReducerSlot reducer_{std::make_unique<CountedReducer>(&destroyed_)};
  ReducerHandOvers hand_overs_;
  PlanSwitchRequests switches_{"j", [] {}};
  RankRestartInbox restarts_{[] {}};
  PublishedState published_{Formed()};
  RecordingEvents events_;
  int64_t now_ns_ = 1'000'000'000;
  int wakes_ = 0;
  std::vector<ReformationRequest> requests_;
  std::unique_ptr<ReformationDriver> driver_;
};

TEST_F(ReformationDriverTest, NothingPostedNothingHappens) {
  EXPECT_FALSE(driver_->Step());
  EXPECT_TRUE(driver_->epoch().running());
  EXPECT_TRUE(job_.phases.empty());
  EXPECT_EQ(reducer_.get() != nullptr, true);
}

TEST_F(ReformationDriverTest, ErrorDrainsThenHandsOverThenResumes) {
  hand_overs_.Started();  // a bucket with the reducer
  driver_->inbox().PostError("bucket 3: connection reset");
  EXPECT_EQ(wakes_, 1);
  now_ns_ += 5;
  EXPECT_TRUE(driver_->Step());
  EXPECT_THAT(job_.phases, ElementsAre("draining"));
  EXPECT_EQ(driver_->epoch().reason(), "bucket 3: connection reset");
  EXPECT_EQ(driver_->epoch().broke_ns(), 1'000'000'005);
  // Something is still with the old reducer: it is stopped (its queue
  // completes CANCELLED), the break waits for the completion.
  EXPECT_EQ(reducer_.get(), nullptr);
  EXPECT_EQ(destroyed_.load(), 1);
  EXPECT_TRUE(requests_.empty());
  EXPECT_TRUE(hand_overs_.Done());  // the last completion rings the engine
  EXPECT_TRUE(driver_->Step());
  ASSERT_EQ(requests_.size(), 1u);
  EXPECT_EQ(requests_[0].reason, "bucket 3: connection reset");
  EXPECT_EQ(requests_[0].completed_iteration, 7u);
  EXPECT_EQ(requests_[0].sync_seq, 3u);
  EXPECT_EQ(requests_[0].epoch, 0u);
  ASSERT_EQ(events_.broken.size(), 1u);
  EXPECT_EQ(events_.broken[0].broke_ns, 1'000'000'005);
  EXPECT_THAT(job_.phases, ElementsAre("draining", "reforming"));
  // Re-forming: the engine waits, the handler is told once.
  EXPECT_TRUE(driver_->Step());
  EXPECT_EQ(requests_.size(), 1u);

  now_ns_ += 250'000'000;
  driver_->inbox().PostResult(Result(1));
  EXPECT_FALSE(driver_->Step());
  EXPECT_TRUE(driver_->epoch().running());
  EXPECT_THAT(job_.phases, ElementsAre("draining", "reforming", "running"));
  EXPECT_NE(reducer_.get(), nullptr);  // the new group's
  EXPECT_EQ(job_.new_groups, 1);
  EXPECT_EQ(job_.epoch, 1u);
  ASSERT_EQ(events_.reformed.size(), 1u);
  EXPECT_EQ(events_.reformed[0].reason, "node 'b' lost");
  EXPECT_EQ(events_.reformed[0].at_ns - events_.reformed[0].broke_ns,
            250'000'000);
  EXPECT_EQ(events_.reformed[0].aborted_iteration, 8u);
  EXPECT_THAT(events_.reformed[0].lost_node_ids, ElementsAre("b"));
  // The layout others read moved; the membership changed.
  EXPECT_EQ(published_.world_size(), 2);
  EXPECT_THAT(published_.layout().lost, ElementsAre("b"));
  EXPECT_EQ(published_.layout().last_reason, "node 'b' lost");
  EXPECT_TRUE(driver_->epoch().membership_changed());
  // The next break starts afresh.
  hand_overs_.Started();
  EXPECT_FALSE(hand_overs_.Done());  // not draining: no ring
}

TEST_F(ReformationDriverTest, FirstErrorWinsAndRequestsDuringABreakDrop) {
  driver_->inbox().PostError("first");
  driver_->inbox().PostError("second");
  driver_->inbox().PostRequest("node 'c' asks in");
  EXPECT_TRUE(driver_->Step());  // drained at once: nothing in flight
  ASSERT_EQ(requests_.size(), 1u);
  EXPECT_EQ(requests_[0].reason, "first");
  // Posted while re-forming: dropped (the arrival watcher asks again).
  driver_->inbox().PostRequest("node 'd' asks in");
  EXPECT_TRUE(driver_->Step());
  driver_->inbox().PostResult(Result(1));
  EXPECT_FALSE(driver_->Step());
  EXPECT_FALSE(driver_->Step());
  EXPECT_EQ(requests_.size(), 1u);
}

TEST_F(ReformationDriverTest, AResultNobodyAskedForIsIgnored) {
  driver_->inbox().PostResult(Result(1));
  EXPECT_FALSE(driver_->Step());
  EXPECT_EQ(job_.new_groups, 0);
  EXPECT_EQ(destroyed_.load(), 1);  // its reducer is dropped
  EXPECT_TRUE(job_.phases.empty());
}

TEST_F(ReformationDriverTest, UnsurvivableBreakFailsTheJob) {
  switches_.ExpectRebuild(7);
  driver_->inbox().PostError("bucket 1: reset");
  EXPECT_TRUE(driver_->Step());
  ASSERT_TRUE(job_.failure.has_value());
  EXPECT_THAT(*job_.failure, HasSubstr("a bucket rebuild is pending"));
  EXPECT_TRUE(driver_->epoch().running());
  EXPECT_TRUE(requests_.empty());
}

TEST_F(ReformationDriverTest, JoinInPlayFailsTheJob) {
  job_.join_in_play = true;
  driver_->inbox().PostRequest("node 'c' asks in");
  EXPECT_TRUE(driver_->Step());
  ASSERT_TRUE(job_.failure.has_value());
  EXPECT_THAT(*job_.failure, HasSubstr("join"));
}

TEST_F(ReformationDriverTest, NoHandlerFailsTheJobOnceDrained) {
  driver_->SetHandler(nullptr);
  driver_->inbox().PostError("bucket 1: reset");
  EXPECT_TRUE(driver_->Step());
  ASSERT_TRUE(job_.failure.has_value());
  EXPECT_THAT(*job_.failure, HasSubstr("nothing re-forms it"));
}

TEST_F(ReformationDriverTest, FailedResultFailsTheJobAndEveryReturningRank) {
  std::vector<absl::Status> answers;
  auto record = [&](absl::StatusOr<v1::AttachResponse> a) {
    answers.push_back(a.status());
  };
  std::vector<RankRestartInbox::Request> back;
  back.push_back({1, record});
  driver_->RanksReturned(std::move(back));  // breaks the group
  EXPECT_TRUE(driver_->Step());
  ASSERT_EQ(requests_.size(), 1u);
  EXPECT_EQ(requests_[0].reason, "local rank 1 restarted");
  EXPECT_THAT(requests_[0].restarted_local_ranks, ElementsAre(1));
  restarts_.Post(0, record);  // another return while re-forming
  driver_->inbox().PostResult(
      absl::DeadlineExceededError("the closer timed out"));
  EXPECT_TRUE(driver_->Step());
  ASSERT_TRUE(job_.failure.has_value());
  EXPECT_THAT(*job_.failure, HasSubstr("re-formation after the break "
                                       "(local rank 1 restarted) failed: "
                                       "the closer timed out"));
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].code(), absl::StatusCode::kAborted);
  EXPECT_EQ(answers[1].code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(driver_->has_returned_ranks());
}

TEST_F(ReformationDriverTest, ReturningRanksAnsweredAfterTheResult) {
  std::vector<uint64_t> next;
  auto record = [&](absl::StatusOr<v1::AttachResponse> a) {
    ASSERT_TRUE(a.ok());
    next.push_back(a->next_iteration());
  };
  std::vector<RankRestartInbox::Request> back;
  back.push_back({1, record});
  driver_->RanksReturned(std::move(back));
  EXPECT_TRUE(driver_->has_returned_ranks());
  EXPECT_TRUE(driver_->Step());
  restarts_.Post(0, record);  // met the re-formation
  driver_->inbox().PostResult(Result(1));
  EXPECT_FALSE(driver_->Step());
  EXPECT_THAT(job_.back, ElementsAre(1, 0));
  EXPECT_THAT(next, ElementsAre(9u, 9u));  // after the aborted iteration 8
  EXPECT_FALSE(driver_->has_returned_ranks());
  EXPECT_FALSE(restarts_.pending());
}

TEST_F(ReformationDriverTest, CloseAnswersTheWaitingAndDropsAResult) {
  std::vector<absl::Status> answers;
  std::vector<RankRestartInbox::Request> back;
  back.push_back({1, [&](absl::StatusOr<v1::AttachResponse> a) {
                    answers.push_back(a.status());
                  }});
  driver_->RanksReturned(std::move(back));
  EXPECT_TRUE(driver_->Step());
  driver_->inbox().PostResult(Result(1));
  driver_->Close(absl::CancelledError("job 'j' stopped"));
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(destroyed_.load(), 2);  // the old reducer, the dropped result's
}

}  // namespace
}  // namespace gradd
