// Bucket rebuild through the JobManager's handler interface (ranks are
// threads on the real control block and memory, as in job_manager_test),
// and the multi-node agreement over an in-memory rendezvous store.
#include "server/engine/job/rebuild.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/engine/manager/job_manager.h"
#include "server/rendezvous/kv_store.h"
#include "tests/unit/engine/manager/fake_session_registry.h"
#include "tests/unit/engine/manager/job_manager_fixture.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct PendingRebuild {
  absl::Notification done;
  absl::StatusOr<v1::RebuildBucketsResponse> result =
      absl::UnknownError("pending");
  absl::StatusOr<v1::RebuildBucketsResponse> Get() {
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return absl::DeadlineExceededError("test: rebuild never answered");
    }
    return result;
  }
};

std::shared_ptr<PendingRebuild> StartRebuild(NodeHandlerInterface& handler,
                                             const std::string& job,
                                             const TestRank& rank,
                                             uint64_t iteration,
                                             std::vector<int32_t> order) {
  v1::RebuildBucketsRequest req;
  req.set_job_id(job);
  req.set_local_rank(rank.rank());
  req.set_session_id(rank.session());
  req.set_iteration(iteration);
  for (int32_t p : order) req.add_ready_order(p);
  auto pending = std::make_shared<PendingRebuild>();
  handler.HandleRebuildBuckets(
      std::move(req), absl::Now() + absl::Seconds(20),
      [pending](absl::StatusOr<v1::RebuildBucketsResponse> r) {
        pending->result = std::move(r);
        pending->done.Notify();
      });
  return pending;
}

std::vector<std::vector<int32_t>> Params(
    const google::protobuf::RepeatedPtrField<v1::BucketSpec>& buckets) {
  std::vector<std::vector<int32_t>> out;
  for (const v1::BucketSpec& b : buckets) {
    out.emplace_back(b.param_indices().begin(), b.param_indices().end());
  }
  return out;
}

// Six float32 parameters of 16 elements (64 bytes); caps of 128 bytes put
// two in each bucket.
const std::vector<TestParam> kModel = {
    {"p0", {16}}, {"p1", {16}}, {"p2", {16}},
    {"p3", {16}}, {"p4", {16}}, {"p5", {16}},
};
constexpr double kCapMb = 128.0 / (1 << 20);

class RebuildTest : public JobManagerFixture {
 protected:
  std::vector<std::unique_ptr<TestRank>> AttachJob(const std::string& job,
                                                   int world) {
    return JobManagerFixture::AttachJob(job, world, kModel, kCapMb, kCapMb);
  }

  // One iteration on `buckets`: rank r writes (r + 1) * (iteration + i)
  // into element i of every parameter, publishes, waits; returns whether
  // every element then holds the exact average.
  static bool RunIteration(
      std::vector<std::unique_ptr<TestRank>>& ranks,
      const google::protobuf::RepeatedPtrField<v1::BucketSpec>& buckets,
      uint64_t it) {
    const int world = static_cast<int>(ranks.size());
    for (auto& rank : ranks) {
      for (int b = 0; b < buckets.size(); ++b) {
        float* data =
            reinterpret_cast<float*>(rank->memory() + buckets[b].offset());
        for (size_t i = 0; i < buckets[b].size_bytes() / 4; ++i) {
          data[i] = static_cast<float>((rank->rank() + 1) * (it + i));
        }
        rank->Publish(b, it);
      }
    }
    bool right = true;
    for (auto& rank : ranks) {
      const bool done = WaitForDaemon(
          rank->header(), rank->me(),
          [&] {
            for (int b = 0; b < buckets.size(); ++b) {
              if (rank->Done(b) < it) return false;
            }
            return true;
          },
          std::chrono::microseconds(20), std::chrono::seconds(20));
      if (!done) return false;
      for (int b = 0; b < buckets.size(); ++b) {
        const float* data = reinterpret_cast<const float*>(rank->memory() +
                                                           buckets[b].offset());
        for (size_t i = 0; i < buckets[b].size_bytes() / 4; ++i) {
          // sum over r of (r + 1) * (it + i), divided by world.
          const float want =
              static_cast<float>((world * (world + 1) / 2) * (it + i) /
                                 static_cast<double>(world));
          right &= data[i] == want;
        }
      }
    }
    return right;
  }
};

TEST_F(RebuildTest, EveryRankGetsThePlanOfLocalRankZerosOrder) {
  auto ranks = AttachJob("rb", 2);
  ASSERT_EQ(ranks.size(), 2u);
  const auto& initial = ranks[0]->response().buckets();
  ASSERT_THAT(Params(initial), ElementsAre(ElementsAre(5, 4), ElementsAre(3, 2),
                                           ElementsAre(1, 0)));
  EXPECT_EQ(ranks[0]->response().bucket_slots(), 6u);
  ASSERT_TRUE(RunIteration(ranks, initial, 1));

  // Rank 1's order differs; rank 0's wins, as torch broadcasts rank 0's.
  auto a = StartRebuild(manager(), "rb", *ranks[0], 1, {0, 2, 4, 1, 3, 5});
  auto b = StartRebuild(manager(), "rb", *ranks[1], 1, {5, 4, 3, 2, 1, 0});
  auto ra = a->Get();
  auto rb = b->Get();
  ASSERT_TRUE(ra.ok()) << ra.status();
  ASSERT_TRUE(rb.ok()) << rb.status();
  EXPECT_THAT(
      Params(ra->buckets()),
      ElementsAre(ElementsAre(0, 2), ElementsAre(4, 1), ElementsAre(3, 5)));
  EXPECT_EQ(ra->SerializeAsString(), rb->SerializeAsString());
  EXPECT_EQ(ra->first_iteration(), 2u);

  // The new plan averages exactly, iteration after iteration.
  for (uint64_t it = 2; it <= 4; ++it) {
    ASSERT_TRUE(RunIteration(ranks, ra->buckets(), it)) << "iteration " << it;
  }
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();

  // Buckets are rebuilt once.
  auto again = StartRebuild(manager(), "rb", *ranks[0], 4, {0, 1, 2, 3, 4, 5});
  EXPECT_THAT(std::string(again->Get().status().message()),
              HasSubstr("rebuilt them already"));
}

TEST_F(RebuildTest, ARankThatNeverAsksFailsTheJobInBoundedTime) {
  config_.set_attach_timeout_ms(300);
  auto ranks = AttachJob("lone", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  auto a = StartRebuild(manager(), "lone", *ranks[0], 1, {0, 1, 2, 3, 4, 5});
  auto r = a->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("job 'lone': local rank 1 did not ask to rebuild "
                        "buckets after iteration 1"));
  // The other rank learns it from the control block.
  EXPECT_EQ(ranks[1]->Error().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(ranks[1]->Error().message()),
              HasSubstr("bucket rebuild failed"));
}

TEST_F(RebuildTest, RanksThatDisagreeOnTheIterationFailTheJob) {
  auto ranks = AttachJob("skew", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  auto a = StartRebuild(manager(), "skew", *ranks[0], 1, {0, 1, 2, 3, 4, 5});
  auto b = StartRebuild(manager(), "skew", *ranks[1], 2, {0, 1, 2, 3, 4, 5});
  EXPECT_THAT(std::string(a->Get().status().message()),
              HasSubstr("local rank 0 rebuilds buckets after iteration 1 but "
                        "local rank 1 after iteration 2"));
  EXPECT_EQ(b->Get().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(ranks[0]->Error().ok());
}

TEST_F(RebuildTest, ABadOrderFromLocalRankZeroFailsTheJob) {
  auto ranks = AttachJob("bad", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  auto a = StartRebuild(manager(), "bad", *ranks[0], 1, {0, 1, 1, 3, 4, 5});
  auto b = StartRebuild(manager(), "bad", *ranks[1], 1, {0, 1, 2, 3, 4, 5});
  auto r = a->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("names parameter 1 (\"p1\") twice"));
  EXPECT_EQ(b->Get().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RebuildTest, ARankLeavingDuringTheRebuildAbortsIt) {
  auto ranks = AttachJob("gone", 2);
  ASSERT_EQ(ranks.size(), 2u);
  auto a = StartRebuild(manager(), "gone", *ranks[0], 1, {0, 1, 2, 3, 4, 5});
  sessions_.Close(ranks[1]->session());
  auto r = a->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("local rank 1 of job 'gone' left while the job was "
                        "rebuilding its buckets"));
}

TEST_F(RebuildTest, ARankThatLeftBeforeTheRebuildFailsItAtOnce) {
  auto ranks = AttachJob("left", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  ASSERT_TRUE(Detach(manager(), "left", 1, ranks[1]->session()).ok());
  auto a = StartRebuild(manager(), "left", *ranks[0], 1, {0, 1, 2, 3, 4, 5});
  auto r = a->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("local rank 1 of job 'left' left; the job cannot "
                        "rebuild its buckets without it"));
}

TEST_F(RebuildTest, OnlyARanksOwnSessionMayAskForIt) {
  auto ranks = AttachJob("own", 2);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  // Rank 0's session asking for rank 1: refused at once, naming rank 1.
  v1::RebuildBucketsRequest req;
  req.set_job_id("own");
  req.set_local_rank(1);
  req.set_session_id(ranks[0]->session());
  req.set_iteration(1);
  for (int32_t p = 0; p < 6; ++p) req.add_ready_order(p);
  auto pending = std::make_shared<PendingRebuild>();
  manager().HandleRebuildBuckets(
      std::move(req), absl::Now() + absl::Seconds(20),
      [pending](absl::StatusOr<v1::RebuildBucketsResponse> r) {
        pending->result = std::move(r);
        pending->done.Notify();
      });
  auto r = pending->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("local rank 1 of job 'own' is not attached through "
                        "session"));
  // The real ranks still rebuild together.
  auto a = StartRebuild(manager(), "own", *ranks[0], 1, {0, 1, 2, 3, 4, 5});
  auto b = StartRebuild(manager(), "own", *ranks[1], 1, {0, 1, 2, 3, 4, 5});
  EXPECT_TRUE(a->Get().ok());
  EXPECT_TRUE(b->Get().ok());
}

// --- autotune (bucket_cap_mb: auto) ---------------------------------------

// Caps of 64, 128 and 256 bytes: 5, 3 and 2 buckets of kModel after a first
// bucket of 128 bytes (three distinct plans); each trial one warm-up and
// one measured iteration.
class AutotuneTest : public RebuildTest {
 protected:
  void SetUp() override {
    RebuildTest::SetUp();
    config_.set_bucket_cap_auto(true);
    config_.set_autotune_caps_mb(
        "0.00006103515625,0.0001220703125,0.000244140625");
    config_.set_autotune_warmup_iterations(1);
    config_.set_autotune_measured_iterations(1);
    follow_plan_switches_ = true;
  }
  // The daemon's default cap (auto), kCapMb for the first bucket.
  std::vector<std::unique_ptr<TestRank>> AttachAuto(const std::string& job) {
    return JobManagerFixture::AttachJob(job, 2, kModel, 0, kCapMb);
  }
  // Both ranks switch after `it`; the answer (the same for both).
  absl::StatusOr<v1::RebuildBucketsResponse> SwitchAfter(
      const std::string& job, std::vector<std::unique_ptr<TestRank>>& ranks,
      uint64_t it) {
    auto a = StartRebuild(manager(), job, *ranks[0], it, {0, 1, 2, 3, 4, 5});
    auto b = StartRebuild(manager(), job, *ranks[1], it, {0, 1, 2, 3, 4, 5});
    auto ra = a->Get();
    auto rb = b->Get();
    if (!ra.ok()) return ra.status();
    if (!rb.ok()) return rb.status();
    EXPECT_EQ(ra->SerializeAsString(), rb->SerializeAsString());
    return ra;
  }
  std::optional<AutotuneSnapshot> Tune(const std::string& job) {
    auto snaps = manager().Snapshot(absl::Now() + absl::Seconds(10), false);
    if (!snaps.ok()) return std::nullopt;
    for (const JobSnapshot& s : *snaps) {
      if (s.job_id == job) return s.autotune;
    }
    return std::nullopt;
  }
};

TEST_F(AutotuneTest, TriesEachCapAtTheNamedIterationsThenSettles) {
  auto ranks = AttachAuto("at");
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(Tune("at").has_value());
  EXPECT_EQ(Tune("at")->state, BucketAutotune::State::kWaiting);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));

  // The rebuild is trial 1 (64 bytes): the ready order {0..5}, after a
  // first bucket of two, one parameter per bucket.
  auto r = SwitchAfter("at", ranks, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->buckets_size(), 5);
  EXPECT_EQ(r->next_switch_after(), 3u);
  EXPECT_EQ(Tune("at")->setting.trial, 1);
  EXPECT_EQ(Tune("at")->setting.trials, 3);
  std::vector<int> buckets = {r->buckets_size()};
  uint64_t it = 1;
  while (r->next_switch_after() != 0) {
    // Every iteration of every trial averages exactly.
    for (++it; it <= r->next_switch_after(); ++it) {
      ASSERT_TRUE(RunIteration(ranks, r->buckets(), it)) << "iteration " << it;
    }
    --it;
    r = SwitchAfter("at", ranks, it);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->first_iteration(), it + 1);
    buckets.push_back(r->buckets_size());
  }
  // Three trials (5, 3, 2 buckets) and the switch to the winner.
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_THAT(std::vector<int>(buckets.begin(), buckets.begin() + 3),
              ElementsAre(5, 3, 2));
  EXPECT_EQ(it, 7u);
  std::optional<AutotuneSnapshot> tune = Tune("at");
  ASSERT_TRUE(tune.has_value());
  EXPECT_EQ(tune->state, BucketAutotune::State::kSettled);
  EXPECT_EQ(tune->settled_after, 7u);
  ASSERT_EQ(tune->trials_done.size(), 3u);
  for (const BucketAutotune::Trial& t : tune->trials_done) {
    EXPECT_EQ(t.iterations, 1);
    EXPECT_GT(t.step_ns, 0);
  }
  // The winner is the fastest trial's cap, and its plan runs.
  const BucketAutotune::Trial* best = &tune->trials_done[0];
  for (const BucketAutotune::Trial& t : tune->trials_done) {
    if (t.step_ns < best->step_ns) best = &t;
  }
  EXPECT_EQ(tune->setting.cap_bytes, best->cap_bytes);
  const int want = best->cap_bytes == 64 ? 5 : best->cap_bytes == 128 ? 3 : 2;
  EXPECT_EQ(buckets.back(), want);
  for (uint64_t next = 8; next <= 9; ++next) {
    ASSERT_TRUE(RunIteration(ranks, r->buckets(), next));
  }
  // Settled is final.
  auto again = StartRebuild(manager(), "at", *ranks[0], 9, {0, 1, 2, 3, 4, 5});
  EXPECT_THAT(std::string(again->Get().status().message()),
              HasSubstr("rebuilt them already"));
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();
}

TEST_F(AutotuneTest, ARankRunningPastASwitchFailsTheJob) {
  auto ranks = AttachAuto("past");
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  auto r = SwitchAfter("past", ranks, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->next_switch_after(), 3u);
  ASSERT_TRUE(RunIteration(ranks, r->buckets(), 2));
  ASSERT_TRUE(RunIteration(ranks, r->buckets(), 3));
  // Rank 1 goes on into iteration 4 instead of switching.
  ranks[1]->Publish(0, 4);
  absl::Status error = ranks[0]->Error();
  for (int i = 0; i < 200 && error.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    error = ranks[0]->Error();
  }
  EXPECT_FALSE(error.ok());
}

TEST_F(AutotuneTest, ClientsThatDoNotFollowSwitchesKeepTheirCap) {
  follow_plan_switches_ = false;
  auto ranks = AttachAuto("old");
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_FALSE(Tune("old").has_value());
  ASSERT_TRUE(RunIteration(ranks, ranks[0]->response().buckets(), 1));
  auto r = SwitchAfter("old", ranks, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->next_switch_after(), 0u);
}

// --- multi-node agreement ------------------------------------------------

v1::RebuildOrder Order(uint64_t it, std::vector<int32_t> order, uint64_t cap) {
  v1::RebuildOrder o;
  o.set_iteration(it);
  o.set_first_bucket_cap_bytes(cap);
  o.set_bucket_cap_bytes(cap);
  for (int32_t p : order) o.add_ready_order(p);
  return o;
}

absl::StatusOr<std::string> Fingerprint(const v1::RebuildOrder& o) {
  std::vector<ParamInfo> params;
  for (int i = 0; i < o.ready_order_size(); ++i) {
    params.push_back({"p" + std::to_string(i), {16}, DType::kFloat32});
  }
  PlannerOptions caps;
  caps.first_bucket_cap_bytes = o.first_bucket_cap_bytes();
  caps.bucket_cap_bytes = o.bucket_cap_bytes();
  std::vector<int32_t> order(o.ready_order().begin(), o.ready_order().end());
  auto plan = PlanBucketsInOrder(params, order, caps);
  if (!plan.ok()) return plan.status();
  return PlanFingerprint(*plan);
}

RebuildAgreement Agreement(int node_rank, absl::Duration timeout) {
  RebuildAgreement a;
  a.job_id = "multi";
  a.prefix = "round1";
  a.node_rank = node_rank;
  a.num_nodes = 2;
  a.timeout = timeout;
  return a;
}

TEST(AgreeOnRebuildTest, NodeRankZerosOrderAndCapsWinOnEveryNode) {
  KvStore store;
  absl::StatusOr<v1::RebuildOrder> got0, got1;
  // Node 1 arrives first, with its own order and caps.
  std::thread n1([&] {
    got1 = AgreeOnRebuild(store, Agreement(1, absl::Seconds(10)),
                          Order(1, {5, 4, 3, 2, 1, 0}, 64), Fingerprint);
  });
  got0 = AgreeOnRebuild(store, Agreement(0, absl::Seconds(10)),
                        Order(1, {0, 2, 4, 1, 3, 5}, 128), Fingerprint);
  n1.join();
  ASSERT_TRUE(got0.ok()) << got0.status();
  ASSERT_TRUE(got1.ok()) << got1.status();
  EXPECT_THAT(got1->ready_order(), ElementsAre(0, 2, 4, 1, 3, 5));
  EXPECT_EQ(got1->bucket_cap_bytes(), 128u);
  EXPECT_EQ(got0->SerializeAsString(), got1->SerializeAsString());
}

TEST(AgreeOnRebuildTest, ANodeThatNeverRebuildsIsNamedAtTheTimeout) {
  KvStore store;
  auto got = AgreeOnRebuild(store, Agreement(0, absl::Milliseconds(300)),
                            Order(1, {0, 1, 2}, 128), Fingerprint);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("job 'multi': node rank 1 did not rebuild buckets "
                        "after iteration 1"));
}

TEST(AgreeOnRebuildTest, NodesAtDifferentIterationsFail) {
  KvStore store;
  absl::StatusOr<v1::RebuildOrder> got0;
  std::thread n0([&] {
    got0 = AgreeOnRebuild(store, Agreement(0, absl::Milliseconds(500)),
                          Order(1, {0, 1, 2}, 128), Fingerprint);
  });
  auto got1 = AgreeOnRebuild(store, Agreement(1, absl::Seconds(5)),
                             Order(2, {0, 1, 2}, 128), Fingerprint);
  n0.join();
  EXPECT_THAT(std::string(got1.status().message()),
              HasSubstr("node rank 0 rebuilds buckets after iteration 1 but "
                        "node rank 1 after iteration 2"));
  // Node 0 never gets node 1's acknowledgement.
  EXPECT_EQ(got0.status().code(), absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace gradd
