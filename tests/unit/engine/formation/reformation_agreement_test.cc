// What only one re-formation agreement does: the built-in store's closer
// (beats, silence, tombstones, old epochs' keys) and a store with leases and
// transactions (one swap decides, leases stand for liveness); and the same
// re-formation over the coordinator's gRPC service (reformation_fixture.h).
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
#include "server/engine/formation/reformation.h"
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

TEST_P(ClosedByACloserTest, ASilentNodeIsNotWaitedForTheWholeSettle) {
  // c beat, then died: a and b close without it once it has been silent
  // for `silence`, long before the settle.
  std::atomic<bool> stop{false};
  std::thread c = Beater(store_, "c", absl::Milliseconds(200), &stop);
  c.join();
  std::vector<ReformOptions> nodes;
  for (const char* id : {"a", "b"}) {
    nodes.push_back(Survivor(id, ThreeNodes()));
    nodes.back().settle = absl::Seconds(15);
    nodes.back().silence = absl::Milliseconds(400);
  }
  const absl::Time start = absl::Now();
  auto results = ReformAll(nodes);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "b"));
    EXPECT_THAT(r->lost, ElementsAre("c"));
  }
}

TEST_P(ClosedByACloserTest,
       ABeatingNodeIsWaitedForAndANodeThatNeverBeatGetsTheSettle) {
  // c beats and enters late (after several silences' worth): it is in the
  // epoch. d never beat (no verdict on it): the closer waits the settle.
  std::vector<JobNode> four = ThreeNodes();
  four.push_back(JobNode{"d", 3, 1, 4});
  std::atomic<bool> stop{false};
  std::thread c = Beater(store_, "c", absl::InfiniteDuration(), &stop);
  std::vector<ReformOptions> nodes;
  for (const char* id : {"a", "b", "c"}) {
    nodes.push_back(Survivor(id, four));
    nodes.back().settle = absl::Seconds(3);
    nodes.back().silence = absl::Milliseconds(300);
  }
  std::vector<absl::StatusOr<Reformed>> results(3);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      if (i == 2) absl::SleepFor(absl::Milliseconds(1200));
      results[i] = ReformNodeJob(store_, nodes[i]);
    });
  }
  for (auto& t : threads) t.join();
  stop = true;
  c.join();
  EXPECT_GE(absl::Now() - start, absl::Seconds(3));  // d's settle
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "b", "c"));
    EXPECT_THAT(r->lost, ElementsAre("d"));
  }
}

TEST_P(ClosedByACloserTest, OlderEpochsKeysAreDeleted) {
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  auto first = ReformAll({Survivor("a", two), Survivor("b", two)});
  ASSERT_TRUE(first[0].ok()) << first[0].status();
  const size_t after_one = store_.NumKeys(kJob);
  const std::vector<JobNode> running = first[0]->layout.nodes;
  auto second =
      ReformAll({Survivor("a", running, 2), Survivor("b", running, 2)});
  ASSERT_TRUE(second[0].ok()) << second[0].status();
  // Epoch 1's keys went (but its "joined" tombstone), epoch 2's came.
  EXPECT_FALSE(
      store_.Get(kJob, "elastic1/epoch1/members", absl::Milliseconds(1)).ok());
  EXPECT_TRUE(
      store_.Get(kJob, "elastic1/epoch1/joined", absl::Milliseconds(1)).ok());
  EXPECT_LE(store_.NumKeys(kJob), after_one + 2);
  for (const std::string& key : store_.Written()) {
    if (absl::StartsWith(key, "elastic1/epoch1/") &&
        key != "elastic1/epoch1/joined") {
      EXPECT_FALSE(store_.Get(kJob, key, absl::Milliseconds(1)).ok()) << key;
    }
  }
}

TEST_P(DecidedByTransactionTest, ANodeWhoseLeaseWentIsNotWaitedFor) {
  // c's daemon vanished: its liveness key went with its lease. a and b
  // decide without it at once, long before the settle; d (alive, not in
  // the job) changes nothing.
  ASSERT_TRUE(store_.Delete(kJob, "elastic1/alive/c").ok());
  std::vector<ReformOptions> nodes;
  for (const char* id : {"a", "b"}) {
    nodes.push_back(Survivor(id, ThreeNodes()));
    nodes.back().settle = absl::Seconds(15);
  }
  const absl::Time start = absl::Now();
  auto results = ReformAll(nodes, /*allreduce=*/true);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_THAT(results[i]->layout.NodeIds(), ElementsAre("a", "b"));
    EXPECT_THAT(results[i]->lost, ElementsAre("c"));
    EXPECT_EQ(results[i]->cause, ReformCause::kNodeLost);
    EXPECT_THAT(sums_[i], ElementsAre(3, 20, 200));
  }
  EXPECT_EQ(Text(store_.Get(kJob, "elastic1/epoch", absl::ZeroDuration())),
            "1");
}

TEST_P(DecidedByTransactionTest, OneSwapDecidesNoCloserNoBeatsNoTombstone) {
  // Three nodes decide at once, twice: one compare-and-swap wins each
  // epoch, every node gets its verdict; nothing counts closers, nothing
  // beats, and epoch 1's keys all go once epoch 2 is decided ("joined"
  // too: no tombstone).
  auto first =
      ReformAll({Survivor("a", ThreeNodes()), Survivor("b", ThreeNodes()),
                 Survivor("c", ThreeNodes())});
  for (const auto& r : first) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_THAT(r->layout.NodeIds(), ElementsAre("a", "b", "c"));
    EXPECT_THAT(r->lost, IsEmpty());
  }
  EXPECT_EQ(store_.SwapsWon(), 1);
  EXPECT_GE(store_.SwapsTried(), 1);
  const std::vector<JobNode> running = first[0]->layout.nodes;
  auto second = ReformAll({Survivor("a", running, 2), Survivor("b", running, 2),
                           Survivor("c", running, 2)});
  for (const auto& r : second) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->epoch, 2u);
  }
  EXPECT_EQ(store_.SwapsWon(), 2);
  EXPECT_EQ(Text(store_.Get(kJob, "elastic1/epoch", absl::ZeroDuration())),
            "2");
  for (const std::string& key : store_.Written()) {
    EXPECT_FALSE(absl::EndsWith(key, "/closed")) << key;
    if (absl::StartsWith(key, "elastic1/epoch1/")) {
      EXPECT_FALSE(store_.Get(kJob, key, absl::ZeroDuration()).ok()) << key;
    }
  }
  for (const std::string& key : store_.Added()) {
    EXPECT_FALSE(absl::StrContains(key, "/alive/")) << key;
  }
}

TEST_P(DecidedByTransactionTest, AJobWhoseKeysWentEndsTheReformationAtOnce) {
  // b re-forms epoch 2 alone while the job ends on every node and its last
  // node deletes its keys (LeaveJob): b stops with ABORTED in moments,
  // rather than deciding into a deleted job or retrying until the timeout,
  // and writes nothing into the deleted job.
  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  ASSERT_TRUE(store_.Set(kJob, "elastic1/epoch", "1").ok());
  ASSERT_TRUE(store_.Delete(kJob, "elastic1/alive/a").ok());
  ASSERT_TRUE(LeaveJob(store_, kJob, kElastic, "c").ok());
  ASSERT_TRUE(LeaveJob(store_, kJob, kElastic, "d").ok());
  ASSERT_TRUE(LeaveJob(store_, kJob, kElastic, "b").ok());
  ASSERT_EQ(store_.NumKeys(kJob), 0u);
  ReformOptions b = Survivor("b", two, 2);
  b.min_nodes = 2;
  const absl::Time start = absl::Now();
  absl::StatusOr<Reformed> r = ReformNodeJob(store_, b);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the job's keys are gone"));
  EXPECT_FALSE(
      store_.Get(kJob, "elastic1/epoch2/members", absl::ZeroDuration()).ok());
  EXPECT_EQ(store_.SwapsTried(), 0);
  EXPECT_EQ(store_.NumKeys(kJob), 0u);
}

TEST_P(DecidedByTransactionTest, LeaveJobDeletesTheJobWithTheLastNode) {
  ASSERT_TRUE(store_.Delete(kJob, "elastic1/alive/c").ok());
  ASSERT_TRUE(store_.Delete(kJob, "elastic1/alive/d").ok());
  ASSERT_TRUE(MarkRunning(store_, kJob, kElastic, "round1", "a").ok());
  ASSERT_TRUE(MarkRunning(store_, kJob, kElastic, "round1", "b").ok());
  ASSERT_TRUE(store_.Set(kJob, "round1/closed", "formed").ok());
  ASSERT_TRUE(LeaveJob(store_, kJob, kElastic, "a").ok());
  EXPECT_FALSE(store_.Get(kJob, "elastic1/alive/a", absl::ZeroDuration()).ok());
  EXPECT_TRUE(store_.Get(kJob, "elastic1/running", absl::ZeroDuration()).ok());
  ASSERT_TRUE(LeaveJob(store_, kJob, kElastic, "b").ok());
  EXPECT_EQ(store_.NumKeys(kJob), 0u);
}

TEST_P(ClosedByACloserTest, LeaveJobLeavesTheKeysToTheJobTtl) {
  ASSERT_TRUE(MarkRunning(store_, kJob, kElastic, "round1", "a").ok());
  ASSERT_TRUE(LeaveJob(store_, kJob, kElastic, "a").ok());
  EXPECT_TRUE(store_.Get(kJob, "elastic1/running", absl::ZeroDuration()).ok());
}

INSTANTIATE_TEST_SUITE_P(Stores, ClosedByACloserTest, ::testing::Values(false),
                         [](const auto&) { return "Closer"; });
INSTANTIATE_TEST_SUITE_P(Stores, DecidedByTransactionTest,
                         ::testing::Values(true),
                         [](const auto&) { return "Transaction"; });

// The same over the coordinator's gRPC service, each node with its own
// client, as the daemons run it: the quick probes and blocking waits behave
// the same there, and a node outside rendezvous.expected_node_ids cannot
// announce itself.
TEST(ReformationOverServiceTest, ArrivalJoinsAndUnlistedNodeIsRefused) {
  RendezvousServer::Options server_options;
  server_options.listen_address = "127.0.0.1:0";
  server_options.expected_node_ids = {"a", "b", "c"};
  auto server = RendezvousServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto connect = [&] {
    RendezvousClient::Options options;
    options.address = (*server)->address();
    auto client = RendezvousClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  };
  std::unique_ptr<RendezvousClient> stranger = connect();
  absl::StatusOr<int64_t> refused = AnnounceArrival(*stranger, Arrival("x"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
      << refused.status();

  std::vector<JobNode> two = {JobNode{"a", 0, 1, 0}, JobNode{"b", 1, 1, 1}};
  std::vector<ReformOptions> nodes = {Survivor("a", two), Survivor("b", two),
                                      Arrival("c")};
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (size_t i = 0; i < nodes.size(); ++i) clients.push_back(connect());
  absl::StatusOr<int64_t> n = AnnounceArrival(*clients[2], nodes[2]);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);  // the stranger took no number
  nodes[2].arrival = *n;
  std::vector<absl::StatusOr<Reformed>> results(nodes.size());
  std::vector<std::vector<float>> sums(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = ReformNodeJob(*clients[i], nodes[i]);
      if (!results[i].ok()) return;
      sums[i] = {1, 2};
      EXPECT_TRUE(
          results[i]
              ->backend->AllreduceSum(sums[i].data(), 2, DType::kFloat32)
              .ok());
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < nodes.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_THAT(results[i]->layout.NodeIds(), ElementsAre("a", "b", "c"));
    EXPECT_THAT(results[i]->admitted, ElementsAre("c"));
    EXPECT_EQ(results[i]->arrivals_seen, 1);
    EXPECT_THAT(sums[i], ElementsAre(3, 6));
  }
  ASSERT_TRUE(results[2]->plan.has_value());
  // Backends go before the clients they report through.
  results.clear();
}

}  // namespace
}  // namespace gradd
