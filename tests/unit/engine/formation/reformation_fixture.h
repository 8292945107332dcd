// What the tests of re-formation (reformation_test.cc: membership,
// arrivals, verdicts on both agreements; reformation_agreement_test.cc:
// what only the closer or only the transaction does, and the same over the
// gRPC service) share: a model and plan, nodes' options, and the fixture
// that runs ReformNodeJob for several nodes as threads over one
// FakeRendezvousStore (server/rendezvous/fake_store.h), Gloo on loopback.
#ifndef GRADD_TESTS_UNIT_ENGINE_FORMATION_REFORMATION_FIXTURE_H_
#define GRADD_TESTS_UNIT_ENGINE_FORMATION_REFORMATION_FIXTURE_H_

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/engine/formation/node_formation.h"
#include "server/engine/formation/reformation.h"
#include "server/rendezvous/fake_store.h"

namespace gradd {

inline constexpr char kJob[] = "job";
inline constexpr char kElastic[] = "elastic1";
inline constexpr absl::Duration kSettle = absl::Milliseconds(300);

inline std::vector<ParamInfo> Model() {
  return {ParamInfo{"fc1.weight", {64, 32}, DType::kFloat32},
          ParamInfo{"fc1.bias", {64}, DType::kFloat32},
          ParamInfo{"fc2.weight", {10, 64}, DType::kFloat32}};
}

// Small caps, so the plan has several buckets an arrival must get right.
inline BucketPlan Plan() {
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = 256;
  caps.bucket_cap_bytes = 4096;
  absl::StatusOr<BucketPlan> plan = PlanBuckets(Model(), caps);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The initial formation: a (2 local ranks), b and c (1 each).
inline std::vector<JobNode> ThreeNodes() {
  return {JobNode{"a", 0, 2, 0}, JobNode{"b", 1, 1, 2}, JobNode{"c", 2, 1, 3}};
}

inline int LocalSize(const std::vector<JobNode>& nodes, const std::string& id) {
  for (const JobNode& n : nodes) {
    if (n.node_id == id) return n.local_world_size;
  }
  return 1;
}

// A running node leaving `previous` for `epoch`.
inline ReformOptions Survivor(const std::string& id,
                              std::vector<JobNode> previous,
                              uint64_t epoch = 1) {
  ReformOptions o;
  o.job_id = kJob;
  o.node_id = id;
  o.reformation_prefix = kElastic;
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
inline ReformOptions Arrival(const std::string& id, int requested_offset = -1) {
  ReformOptions o = Survivor(id, {}, 0);
  o.local_world_size = 1;
  o.plan.reset();
  o.requested_offset = requested_offset;
  o.reason = "arrival";
  return o;
}

// Every test runs on both agreements (reformation_agreement.h): param
// false, the built-in store's closer; true, a store with leases and
// transactions (etcd's), where every node of the tests starts alive (its
// liveness key written, as MarkRunning does), so that a node that does not
// enter is waited for the settle on both.
inline std::string Text(const absl::StatusOr<std::string>& v) {
  return v.ok() ? *v : v.status().ToString();
}

class ReformationTest : public ::testing::TestWithParam<bool> {
 protected:
  ReformationTest()
      : store_(FakeRendezvousStore::Options{.leased = GetParam()}) {
    MarkAlive();
  }

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

  FakeRendezvousStore store_;
  std::vector<std::vector<float>> sums_;
};

// The built-in store's closer only: beats, silence, tombstones.
class ClosedByACloserTest : public ReformationTest {};
// A store with leases and transactions only.
class DecidedByTransactionTest : public ReformationTest {};

// Node `id` beats its job's store every 50 ms for `beating`, then stops
// (its daemon died) or, with `beating` infinite, until `stop`.
inline std::thread Beater(RendezvousStoreInterface& store,
                          const std::string& id, absl::Duration beating,
                          const std::atomic<bool>* stop) {
  return std::thread([&store, id, beating, stop] {
    const absl::Time until = absl::Now() + beating;
    while (absl::Now() < until && !stop->load()) {
      EXPECT_TRUE(Beat(store, kJob, kElastic, id).ok());
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
}

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ENGINE_FORMATION_REFORMATION_FIXTURE_H_
