// ReformNodeJob and its helpers on both agreements (the built-in store's
// closer and a store with leases and transactions): nodes as threads over
// one in-process store, Gloo on loopback (reformation_fixture.h).
#include "server/engine/formation/reformation.h"

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/formation/node_formation.h"
#include "server/rendezvous/kv_store.h"
#include "server/rendezvous/rendezvous_client.h"
#include "server/rendezvous/rendezvous_service.h"
#include "tests/unit/engine/formation/reformation_fixture.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST_P(ReformationTest, ReformationPrefixFollowsTheRound) {
  EXPECT_EQ(ReformationPrefix("round7"), "elastic7");
}

TEST_P(ReformationTest, LostNodeReformsAfterSettleKeepingOffsets) {
  const absl::Time start = absl::Now();
  auto results = ReformAll({Survivor("a", ThreeNodes())},
                           /*allreduce=*/false);
  // One node alone: c and b are lost, a goes on (min_nodes 1).
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_GE(absl::Now() - start, kSettle);
  EXPECT_THAT(results[0]->lost, ElementsAre("b", "c"));

  // Two of three (in a fresh epoch of a fresh job namespace).
  ResetJob();
  const absl::Time start2 = absl::Now();
  results =
      ReformAll({Survivor("b", ThreeNodes()), Survivor("a", ThreeNodes())});
  const absl::Duration took = absl::Now() - start2;
  EXPECT_GE(took, kSettle);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->epoch, 1u);
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "b"));
    EXPECT_THAT(Offsets(r->layout), ElementsAre(0, 2));
    EXPECT_EQ(r->layout.world_size, 3);  // 2 + 1 live, not 4
    EXPECT_EQ(r->layout.num_nodes, 2);
    EXPECT_THAT(r->lost, ElementsAre("c"));
    EXPECT_THAT(r->admitted, IsEmpty());
    EXPECT_EQ(r->store_prefix, "elastic1/epoch1");
    ASSERT_NE(r->backend, nullptr);
    EXPECT_EQ(r->backend->num_nodes(), 2);
  }
  EXPECT_EQ(results[0]->layout.node_rank, 1);  // b
  EXPECT_EQ(results[0]->layout.global_rank_offset, 2);
  EXPECT_EQ(results[1]->layout.node_rank, 0);  // a
}

TEST_P(ReformationTest, AllPresentReformsWithoutWaitingForTheSettle) {
  std::vector<ReformOptions> nodes;
  for (const char* id : {"c", "a", "b"}) {
    nodes.push_back(Survivor(id, ThreeNodes()));
    nodes.back().settle = absl::Seconds(10);
  }
  const absl::Time start = absl::Now();
  auto results = ReformAll(nodes, /*allreduce=*/true);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_THAT(results[i]->layout.NodeIds(), ElementsAre("a", "b", "c"));
    EXPECT_THAT(Offsets(results[i]->layout), ElementsAre(0, 2, 3));
    EXPECT_EQ(results[i]->layout.world_size, 4);
    EXPECT_THAT(results[i]->lost, IsEmpty());
    EXPECT_THAT(sums_[i], ElementsAre(1 + 2 + 3, 30, 300));
  }
}

TEST_P(ReformationTest, BelowMinNodesFailsEveryEntrantNamingTheLost) {
  std::vector<ReformOptions> nodes = {Survivor("a", ThreeNodes()),
                                      Survivor("b", ThreeNodes())};
  for (ReformOptions& o : nodes) o.min_nodes = 3;
  auto results = ReformAll(nodes);
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(r.status().message(),
                AllOf(HasSubstr("job 'job'"), HasSubstr("min_nodes = 3"),
                      HasSubstr("lost: c"), HasSubstr("saw its peers fail")));
  }
  EXPECT_THAT(results[0].status().message(), HasSubstr("on node 'a'"));
  EXPECT_THAT(results[1].status().message(), HasSubstr("on node 'b'"));
}

TEST_P(ReformationTest, ArrivalsGetNewOrOldOffsetsAndThePlan) {
  // Epoch 1: c is lost.
  auto first =
      ReformAll({Survivor("a", ThreeNodes()), Survivor("b", ThreeNodes())});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  const std::vector<JobNode> running = first[0]->layout.nodes;

  // c comes back (asking for its old offset 3), d is new.
  ReformOptions c = Arrival("c", /*requested_offset=*/3);
  ReformOptions d = Arrival("d");
  ASSERT_TRUE(AnnounceArrival(store_, c).ok());
  ASSERT_TRUE(AnnounceArrival(store_, d).ok());
  // The running nodes' watcher sees them.
  ASSERT_TRUE(WaitForArrival(store_, kJob, kElastic,
                             first[0]->arrivals_seen + 1, absl::Seconds(1))
                  .ok());
  std::vector<ReformOptions> nodes = {d, Survivor("b", running, 2),
                                      Survivor("a", running, 2), c};
  for (ReformOptions& o : nodes) o.settle = absl::Seconds(10);
  const absl::Time start = absl::Now();
  auto results = ReformAll(nodes, /*allreduce=*/true);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // all expected came
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    const Reformed& r = *results[i];
    EXPECT_EQ(r.epoch, 2u);
    EXPECT_THAT(r.layout.NodeIds(), ElementsAre("a", "b", "c", "d"));
    EXPECT_THAT(Offsets(r.layout), ElementsAre(0, 2, 3, 4));
    EXPECT_EQ(r.layout.world_size, 5);
    EXPECT_THAT(r.admitted, ElementsAre("c", "d"));
    EXPECT_THAT(r.lost, IsEmpty());
    EXPECT_EQ(r.arrivals_seen, 2);
    ASSERT_TRUE(r.plan.has_value());
    EXPECT_EQ(r.plan->buckets.size(), Plan().buckets.size());
    EXPECT_EQ(r.plan->total_bytes, Plan().total_bytes);
    EXPECT_THAT(sums_[i], ElementsAre(1 + 2 + 3 + 4, 40, 400));
  }
  EXPECT_GT(Plan().buckets.size(), 1u);
  EXPECT_EQ(results[0]->layout.node_rank, 3);           // d
  EXPECT_EQ(results[3]->layout.global_rank_offset, 3);  // c, as before
}

TEST_P(ReformationTest, AReturningNodeGetsItsOldRanksEpochsLater) {
  // Epoch 1: b (ranks 2..2, not the last) is lost.
  auto first =
      ReformAll({Survivor("a", ThreeNodes()), Survivor("c", ThreeNodes())});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  EXPECT_THAT(Offsets(first[0]->layout), ElementsAre(0, 3));
  std::vector<JobNode> running = first[0]->layout.nodes;

  // Epoch 2: a and c re-form again (say, a rank of c restarted).
  auto second =
      ReformAll({Survivor("a", running, 2), Survivor("c", running, 2)});
  ASSERT_TRUE(second[0].ok()) << second[0].status();
  running = second[0]->layout.nodes;

  // Epoch 3: b's daemon comes back, asking for no offset as an arriving
  // daemon does: it gets its ranks of two epochs ago (2), not the ones
  // after the highest (4).
  ReformOptions b = Arrival("b");
  ASSERT_TRUE(AnnounceArrival(store_, b).ok());
  std::vector<ReformOptions> nodes = {Survivor("a", running, 3),
                                      Survivor("c", running, 3), b};
  for (ReformOptions& o : nodes) o.settle = absl::Seconds(10);
  auto third = ReformAll(nodes);
  for (const auto& r : third) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "c", "b"));
    EXPECT_THAT(Offsets(r->layout), ElementsAre(0, 3, 2));
    EXPECT_EQ(r->layout.world_size, 4);
  }
}

// Issue 32: one event has one reason on every node, the closer's, and
// every node lists the same lost nodes (the departed), the admitted one
// included.
TEST_P(ReformationTest, EveryNodeGetsTheClosersCauseAndTheSameLostNodes) {
  // Epoch 1: local rank 1 of b restarted; a and c only saw b's group break.
  std::vector<ReformOptions> nodes = {Survivor("a", ThreeNodes()),
                                      Survivor("b", ThreeNodes()),
                                      Survivor("c", ThreeNodes())};
  nodes[1].restarted_local_ranks = {1};
  nodes[1].reason = "local rank 1 restarted";
  auto first = ReformAll(nodes);
  for (const auto& r : first) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->cause, ReformCause::kRankRestarted);
    EXPECT_EQ(r->reason, "local rank 1 of node 'b' restarted");
    EXPECT_THAT(r->departed, IsEmpty());
  }
  std::vector<JobNode> running = first[0]->layout.nodes;

  // Epoch 2: c is lost while a rank of a restarts: the loss wins, the line
  // names both.
  nodes = {Survivor("a", running, 2), Survivor("b", running, 2)};
  nodes[0].restarted_local_ranks = {0};
  nodes[1].reason = "gloo allreduce failed: connection reset by peer";
  auto second = ReformAll(nodes);
  for (const auto& r : second) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->cause, ReformCause::kNodeLost);
    EXPECT_EQ(r->reason,
              "node 'c' lost (gloo allreduce failed: connection reset by "
              "peer); local rank 0 of node 'a' restarted");
    EXPECT_THAT(r->departed, ElementsAre("c"));
  }
  running = second[0]->layout.nodes;

  // Epoch 3: c comes back: admitted, lost by nobody any more, on all three
  // (the arrival too).
  ReformOptions c = Arrival("c");
  ASSERT_TRUE(AnnounceArrival(store_, c).ok());
  nodes = {Survivor("a", running, 3), Survivor("b", running, 3), c};
  for (ReformOptions& o : nodes) o.settle = absl::Seconds(10);
  auto third = ReformAll(nodes);
  for (const auto& r : third) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->cause, ReformCause::kNodeAdmitted);
    EXPECT_EQ(r->reason, "node 'c' admitted");
    EXPECT_THAT(r->departed, IsEmpty());
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "b", "c"));
  }
  running = third[0]->layout.nodes;

  // Epoch 4: nothing but a break (say, a transient network error).
  nodes = {Survivor("a", running, 4), Survivor("b", running, 4),
           Survivor("c", running, 4)};
  for (ReformOptions& o : nodes) o.reason = "connection reset";
  auto fourth = ReformAll(nodes);
  for (const auto& r : fourth) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->cause, ReformCause::kOther);
    EXPECT_EQ(r->reason, "connection reset");
  }
}

TEST_P(ReformationTest, ArrivalsBeyondMaxNodesAreRefused) {
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  ReformOptions c = Arrival("c");
  ReformOptions d = Arrival("d");
  ASSERT_TRUE(AnnounceArrival(store_, c).ok());
  ASSERT_TRUE(AnnounceArrival(store_, d).ok());
  std::vector<ReformOptions> nodes = {Survivor("a", two), Survivor("b", two), c,
                                      d};
  for (ReformOptions& o : nodes) o.max_nodes = 3;
  auto results = ReformAll(nodes);
  for (int i : {0, 1, 2}) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_THAT(results[i]->layout.NodeIds(), ElementsAre("a", "b", "c"));
    EXPECT_EQ(results[i]->arrivals_seen, 2);
  }
  ASSERT_FALSE(results[3].ok());
  EXPECT_EQ(results[3].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(results[3].status().message(),
              AllOf(HasSubstr("on node 'd'"), HasSubstr("max_nodes = 3")));
}

TEST_P(ReformationTest, LateArrivalGoesToTheNextEpoch) {
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  auto first = ReformAll({Survivor("a", two), Survivor("b", two)});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  ASSERT_TRUE(first[1].ok()) << first[1].status();
  const std::vector<JobNode> running = first[0]->layout.nodes;

  // c asks for epoch 1, which is closed: it announces itself and waits in
  // epoch 2; the running nodes' watcher sees it and they break.
  absl::StatusOr<Reformed> late;
  std::thread arrival([&] {
    ReformOptions c = Arrival("c");
    c.epoch = 1;
    late = ReformNodeJob(store_, c);
  });
  std::vector<absl::StatusOr<Reformed>> survivors(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(WaitForArrival(store_, kJob, kElastic,
                                 first[i]->arrivals_seen + 1, absl::Seconds(10))
                      .ok());
      survivors[i] =
          ReformNodeJob(store_, Survivor(i == 0 ? "a" : "b", running, 2));
    });
  }
  for (auto& t : threads) t.join();
  arrival.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->epoch, 2u);
  EXPECT_THAT(late->layout.NodeIds(), ElementsAre("a", "b", "c"));
  EXPECT_EQ(late->layout.global_rank_offset, 2);
  for (const auto& r : survivors) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->admitted, ElementsAre("c"));
  }
}

TEST_P(ReformationTest, LateSurvivorComesBackAsArrivalWithItsOffsets) {
  // Epoch 1 closes after the settle without b.
  auto first =
      ReformAll({Survivor("a", ThreeNodes()), Survivor("c", ThreeNodes())});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  ASSERT_THAT(first[0]->lost, ElementsAre("b"));
  const std::vector<JobNode> running = first[0]->layout.nodes;

  // b enters epoch 1 late; a and c see it announced and break again.
  absl::StatusOr<Reformed> late;
  std::thread b(
      [&] { late = ReformNodeJob(store_, Survivor("b", ThreeNodes())); });
  std::vector<absl::StatusOr<Reformed>> survivors(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(WaitForArrival(store_, kJob, kElastic,
                                 first[i]->arrivals_seen + 1, absl::Seconds(10))
                      .ok());
      survivors[i] =
          ReformNodeJob(store_, Survivor(i == 0 ? "a" : "c", running, 2));
    });
  }
  for (auto& t : threads) t.join();
  b.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->epoch, 2u);
  EXPECT_THAT(late->layout.NodeIds(), ElementsAre("a", "c", "b"));
  EXPECT_THAT(Offsets(late->layout), ElementsAre(0, 3, 2));
  EXPECT_EQ(late->layout.world_size, 4);
  for (const auto& r : survivors) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->admitted, ElementsAre("b"));
  }
}

TEST_P(ReformationTest, ArrivalWithoutRunningNodesTimesOut) {
  ReformOptions d = Arrival("d");
  d.timeout = absl::Milliseconds(300);
  absl::StatusOr<Reformed> r = ReformNodeJob(store_, d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("job 'job'"), HasSubstr("node 'd'"),
                    HasSubstr("no node closed the epoch")));
}

TEST_P(ReformationTest, ArrivalWithAnotherModelGetsAClearError) {
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  ReformOptions x = Arrival("x");
  x.params[1].shape = {65};
  ASSERT_TRUE(AnnounceArrival(store_, x).ok());
  auto results = ReformAll({Survivor("a", two), Survivor("b", two), x});
  for (int i : {0, 1}) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_THAT(results[i]->layout.NodeIds(), ElementsAre("a", "b"));
    EXPECT_THAT(results[i]->admitted, IsEmpty());
  }
  ASSERT_FALSE(results[2].ok());
  EXPECT_EQ(results[2].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(results[2].status().message(),
              AllOf(HasSubstr("job 'job'"), HasSubstr("node 'x'"),
                    HasSubstr("model differs"), HasSubstr("fc1.bias")));
}

TEST_P(ReformationTest, SyncSeqIsTheLargestPlusOneAndBehindIsFlagged) {
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  ReformOptions a = Survivor("a", two);
  a.completed_iteration = 10;
  a.sync_seq = 5;
  ReformOptions b = Survivor("b", two);
  b.completed_iteration = 12;
  b.sync_seq = 7;
  auto results = ReformAll({a, b});
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->sync_seq, 8u);
    EXPECT_EQ(r->max_completed, 12u);
  }
  EXPECT_TRUE(results[0]->behind);
  EXPECT_FALSE(results[1]->behind);
}

// The closer publishes the job's initial world size; an arrival (which
// reports 0) learns it from the verdict and, once admitted, passes it on
// to the arrivals after it.
TEST_P(ReformationTest, VerdictCarriesTheInitialWorldSizeToArrivals) {
  // Epoch 1: c is lost; a and b formed the job (world size 4).
  std::vector<ReformOptions> formed = {Survivor("a", ThreeNodes()),
                                       Survivor("b", ThreeNodes())};
  for (ReformOptions& o : formed) o.initial_world_size = 4;
  auto first = ReformAll(formed);
  for (const auto& r : first) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->layout.world_size, 3);
    EXPECT_EQ(r->initial_world_size, 4);
  }

  // Epoch 2: c comes back and does not know it; nor does b (a node that
  // reports 0, as a daemon without the field would): a's value is taken.
  ReformOptions c = Arrival("c");
  EXPECT_EQ(c.initial_world_size, 0);
  ASSERT_TRUE(AnnounceArrival(store_, c).ok());
  const std::vector<JobNode> running = first[0]->layout.nodes;
  ReformOptions a2 = Survivor("a", running, 2);
  a2.initial_world_size = 4;
  ReformOptions b2 = Survivor("b", running, 2);
  auto second = ReformAll({a2, b2, c});
  for (const auto& r : second) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "b", "c"));
    EXPECT_EQ(r->layout.world_size, 4);
    EXPECT_EQ(r->initial_world_size, 4);
  }
  EXPECT_THAT(second[2]->admitted, ElementsAre("c"));

  // Epoch 3: a, the only node that formed the job and knew it, is lost;
  // c passes on what it learned when admitted, and d arrives.
  ReformOptions d = Arrival("d");
  ASSERT_TRUE(AnnounceArrival(store_, d).ok());
  const std::vector<JobNode> now = second[0]->layout.nodes;
  ReformOptions c3 = Survivor("c", now, 3);
  c3.initial_world_size = second[2]->initial_world_size;
  auto third = ReformAll({Survivor("b", now, 3), c3, d});
  for (const auto& r : third) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("b", "c", "d"));
    EXPECT_THAT(r->lost, ElementsAre("a"));
    EXPECT_EQ(r->layout.world_size, 3);
    EXPECT_EQ(r->initial_world_size, 4);
  }
}

// Entrants that report different initial world sizes: the largest wins,
// whichever of them closes, so every node gets the same.
TEST_P(ReformationTest, InitialWorldSizeIsTheLargestReported) {
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  ReformOptions a = Survivor("a", two);
  a.initial_world_size = 3;
  ReformOptions b = Survivor("b", two);
  b.initial_world_size = 5;
  ReformOptions c = Arrival("c");
  ASSERT_TRUE(AnnounceArrival(store_, c).ok());
  auto results = ReformAll({a, b, c});
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->layout.world_size, 3);
    EXPECT_EQ(r->initial_world_size, 5);
  }
}

TEST_P(ReformationTest, BackendsOfTheSurvivorsAllreduce) {
  auto results =
      ReformAll({Survivor("a", ThreeNodes()), Survivor("c", ThreeNodes())},
                /*allreduce=*/true);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_THAT(results[i]->layout.NodeIds(), ElementsAre("a", "c"));
    EXPECT_THAT(Offsets(results[i]->layout), ElementsAre(0, 3));
    EXPECT_THAT(sums_[i], ElementsAre(1 + 2, 20, 200));
  }
}

TEST_P(ReformationTest, WaitForArrivalTimesOutThenSeesTheAnnouncement) {
  absl::Status s =
      WaitForArrival(store_, kJob, kElastic, 1, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  absl::StatusOr<int64_t> n = AnnounceArrival(store_, Arrival("d"));
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_TRUE(
      WaitForArrival(store_, kJob, kElastic, 1, absl::Milliseconds(100)).ok());
  s = WaitForArrival(store_, kJob, kElastic, 2, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST_P(ReformationTest, FindRunningFindsTheMarkedRound) {
  EXPECT_EQ(FindRunning(store_, kJob, absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_.Set(kJob, "round1/closed", "formed").ok());
  ASSERT_TRUE(store_.Set(kJob, "round2/closed", "formed").ok());
  ASSERT_TRUE(MarkRunning(store_, kJob, "elastic2", "round2", "a").ok());
  absl::StatusOr<std::string> found =
      FindRunning(store_, kJob, absl::Seconds(1));
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, "elastic2");
}

INSTANTIATE_TEST_SUITE_P(Stores, ReformationTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Transaction" : "Closer";
                         });

}  // namespace
}  // namespace gradd
