// ReformNodeJob and its helpers: nodes as threads over one in-process
// KvStore (the coordinator's store), Gloo on loopback.
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

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kJob[] = "job";
constexpr char kElastic[] = "elastic1";
constexpr absl::Duration kSettle = absl::Milliseconds(300);

std::vector<ParamInfo> Model() {
  return {ParamInfo{"fc1.weight", {64, 32}, DType::kFloat32},
          ParamInfo{"fc1.bias", {64}, DType::kFloat32},
          ParamInfo{"fc2.weight", {10, 64}, DType::kFloat32}};
}

// Small caps, so the plan has several buckets an arrival must get right.
BucketPlan Plan() {
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = 256;
  caps.bucket_cap_bytes = 4096;
  absl::StatusOr<BucketPlan> plan = PlanBuckets(Model(), caps);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The initial formation: a (2 local ranks), b and c (1 each).
std::vector<JobNode> ThreeNodes() {
  return {JobNode{"a", 0, 2, 0}, JobNode{"b", 1, 1, 2}, JobNode{"c", 2, 1, 3}};
}

int LocalSize(const std::vector<JobNode>& nodes, const std::string& id) {
  for (const JobNode& n : nodes) {
    if (n.node_id == id) return n.local_world_size;
  }
  return 1;
}

// A running node leaving `previous` for `epoch`.
ReformOptions Survivor(const std::string& id, std::vector<JobNode> previous,
                       uint64_t epoch = 1) {
  ReformOptions o;
  o.job_id = kJob;
  o.node_id = id;
  o.elastic_prefix = kElastic;
  o.epoch = epoch;
  o.local_world_size = LocalSize(previous, id);
  o.previous = std::move(previous);
  o.max_nodes = 4;
  o.min_nodes = 1;
  o.params = Model();
  o.plan = Plan();
  o.settle = kSettle;
  o.timeout = absl::Seconds(20);
  o.collective_timeout = absl::Seconds(10);
  o.reason = absl::StrCat("node '", id, "' saw its peers fail");
  return o;
}

// An arriving node (epoch 0: the next one).
ReformOptions Arrival(const std::string& id, int requested_offset = -1) {
  ReformOptions o = Survivor(id, {}, 0);
  o.local_world_size = 1;
  o.plan.reset();
  o.requested_offset = requested_offset;
  o.reason = "arrival";
  return o;
}

// The coordinator's store, remembering every key written (to check what
// the closers delete). `leased`: it plays a store with leases and
// transactions (etcd, reformation_agreement.h) instead: SetOwn's keys are
// the daemons' liveness (a test deletes one to play its lease expiring),
// CompareAndSet is atomic against itself (only the agreement's epoch key
// uses it), and keys go by prefix.
class RecordingStore : public RendezvousStoreInterface {
 public:
  explicit RecordingStore(bool leased = false) : leased_(leased) {}

  bool HasLeases() const override { return leased_; }
  absl::Status SetOwn(absl::string_view job, absl::string_view key,
                      absl::string_view value) override {
    return Set(job, key, value);
  }
  absl::StatusOr<bool> CompareAndSet(
      absl::string_view job, absl::string_view key,
      std::optional<std::string> expected, absl::string_view value,
      absl::Span<const std::pair<std::string, std::string>> also) override {
    if (!leased_) {
      return RendezvousStoreInterface::CompareAndSet(job, key, expected, value,
                                                     also);
    }
    absl::MutexLock cas(&cas_mu_);
    absl::StatusOr<std::string> now = kv_.Get(job, key, absl::ZeroDuration());
    const std::optional<std::string> held =
        now.ok() ? std::optional<std::string>(*now) : std::nullopt;
    {
      absl::MutexLock lock(&mu_);
      ++swaps_tried_;
    }
    if (held != expected) return false;
    for (const auto& [k, v] : also) {
      if (absl::Status s = Set(job, k, v); !s.ok()) return s;
    }
    if (absl::Status s = Set(job, key, value); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    ++swaps_won_;
    return true;
  }
  absl::StatusOr<int64_t> DeletePrefix(absl::string_view job,
                                       absl::string_view prefix) override {
    if (!leased_) return RendezvousStoreInterface::DeletePrefix(job, prefix);
    int64_t n = 0;
    for (const std::string& key : Written()) {
      if (absl::StartsWith(key, prefix) &&
          kv_.Delete(job, key).value_or(false)) {
        ++n;
      }
    }
    return n;
  }
  absl::StatusOr<int64_t> CountPrefix(absl::string_view job,
                                      absl::string_view prefix) override {
    if (!leased_) return RendezvousStoreInterface::CountPrefix(job, prefix);
    int64_t n = 0;
    for (const std::string& key : Written()) {
      if (absl::StartsWith(key, prefix) &&
          kv_.Get(job, key, absl::ZeroDuration()).ok()) {
        ++n;
      }
    }
    return n;
  }

  absl::Status Set(absl::string_view job, absl::string_view key,
                   absl::string_view value) override {
    Record(key);
    return kv_.Set(job, key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view job, absl::string_view key,
                                  absl::Duration timeout) override {
    return kv_.Get(job, key, timeout);
  }
  absl::StatusOr<int64_t> Add(absl::string_view job, absl::string_view key,
                              int64_t delta) override {
    Record(key);
    if (delta != 0) {
      absl::MutexLock lock(&mu_);
      added_.insert(std::string(key));
    }
    return kv_.Add(job, key, delta);
  }
  absl::Status Wait(absl::string_view job, absl::Span<const std::string> keys,
                    absl::Duration timeout) override {
    return kv_.Wait(job, keys, timeout);
  }
  absl::StatusOr<bool> Delete(absl::string_view job,
                              absl::string_view key) override {
    return kv_.Delete(job, key);
  }
  std::string Describe() const override { return kv_.Describe(); }

  size_t NumKeys(absl::string_view job) const { return kv_.NumKeys(job); }
  void DeleteJob(absl::string_view job) { kv_.DeleteJob(job); }
  std::vector<std::string> Written() const {
    absl::MutexLock lock(&mu_);
    return {written_.begin(), written_.end()};
  }
  // Counters moved by Add (not just read).
  std::vector<std::string> Added() const {
    absl::MutexLock lock(&mu_);
    return {added_.begin(), added_.end()};
  }
  int SwapsTried() const {
    absl::MutexLock lock(&mu_);
    return swaps_tried_;
  }
  int SwapsWon() const {
    absl::MutexLock lock(&mu_);
    return swaps_won_;
  }

 private:
  void Record(absl::string_view key) {
    absl::MutexLock lock(&mu_);
    written_.insert(std::string(key));
  }

  const bool leased_;
  KvStore kv_;
  absl::Mutex cas_mu_;
  mutable absl::Mutex mu_;
  std::set<std::string> written_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> added_ ABSL_GUARDED_BY(mu_);
  int swaps_tried_ ABSL_GUARDED_BY(mu_) = 0;
  int swaps_won_ ABSL_GUARDED_BY(mu_) = 0;
};

// Every test runs on both agreements (reformation_agreement.h): param
// false, the built-in store's closer; true, a store with leases and
// transactions (etcd's), where every node of the tests starts alive (its
// liveness key written, as MarkRunning does), so that a node that does not
// enter is waited for the settle on both.
std::string Text(const absl::StatusOr<std::string>& v) {
  return v.ok() ? *v : v.status().ToString();
}

class ReformationTest : public ::testing::TestWithParam<bool> {
 protected:
  ReformationTest() : store_(GetParam()) { MarkAlive(); }

  void MarkAlive() {
    if (!GetParam()) return;
    // The job runs (MarkRunning's mark): a re-formation on a store with
    // leases checks it before deciding.
    EXPECT_TRUE(
        store_.Set(kJob, absl::StrCat(kElastic, "/running"), "round1").ok());
    for (const char* id : {"a", "b", "c", "d"}) {
      EXPECT_TRUE(
          store_.SetOwn(kJob, absl::StrCat(kElastic, "/alive/", id), id).ok());
    }
  }
  // A fresh job namespace, every node alive again.
  void ResetJob() {
    store_.DeleteJob(kJob);
    MarkAlive();
  }

  // Runs ReformNodeJob for every option set at once, one thread per node;
  // with `allreduce`, each formed node then sums {node rank + 1, 10, 100}
  // over the new backend.
  std::vector<absl::StatusOr<Reformed>> ReformAll(
      const std::vector<ReformOptions>& nodes, bool allreduce = false) {
    std::vector<absl::StatusOr<Reformed>> results(nodes.size());
    sums_.assign(nodes.size(), {});
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes.size(); ++i) {
      threads.emplace_back([&, i] {
        results[i] = ReformNodeJob(store_, nodes[i]);
        if (!allreduce || !results[i].ok()) return;
        std::vector<float> v = {
            static_cast<float>(results[i]->layout.node_rank + 1), 10, 100};
        absl::Status s = results[i]->backend->AllreduceSum(v.data(), v.size(),
                                                           DType::kFloat32);
        EXPECT_TRUE(s.ok()) << s;
        sums_[i] = v;
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  static std::vector<int> Offsets(const JobLayout& layout) {
    std::vector<int> out;
    for (const JobNode& n : layout.nodes) out.push_back(n.global_rank_offset);
    return out;
  }

  RecordingStore store_;
  std::vector<std::vector<float>> sums_;
};

TEST_P(ReformationTest, ElasticPrefixFollowsTheRound) {
  EXPECT_EQ(ElasticPrefix("round7"), "elastic7");
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

// Node `id` beats its job's store every 50 ms for `beating`, then stops
// (its daemon died) or, with `beating` infinite, until `stop`.
// The built-in store's closer only: beats, silence, tombstones.
class ClosedByACloserTest : public ReformationTest {};
// A store with leases and transactions only.
class DecidedByTransactionTest : public ReformationTest {};

std::thread Beater(RendezvousStoreInterface& store, const std::string& id,
                   absl::Duration beating, const std::atomic<bool>* stop) {
  return std::thread([&store, id, beating, stop] {
    const absl::Time until = absl::Now() + beating;
    while (absl::Now() < until && !stop->load()) {
      EXPECT_TRUE(Beat(store, kJob, kElastic, id).ok());
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
}

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
  nodes[1].rejoined_local_ranks = {1};
  nodes[1].reason = "local rank 1 rejoined";
  auto first = ReformAll(nodes);
  for (const auto& r : first) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->cause, ReformCause::kRankRejoined);
    EXPECT_EQ(r->reason, "local rank 1 of node 'b' restarted");
    EXPECT_THAT(r->departed, IsEmpty());
  }
  std::vector<JobNode> running = first[0]->layout.nodes;

  // Epoch 2: c is lost while a rank of a restarts: the loss wins, the line
  // names both.
  nodes = {Survivor("a", running, 2), Survivor("b", running, 2)};
  nodes[0].rejoined_local_ranks = {0};
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

INSTANTIATE_TEST_SUITE_P(Stores, ReformationTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Transaction" : "Closer";
                         });
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
