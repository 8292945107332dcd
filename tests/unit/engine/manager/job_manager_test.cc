// JobManager + Job driven through the handler interface (no gRPC) with a
// fake session registry; ranks are threads acting on the real control block
// and bucket memory the daemon hands out.
#include "server/engine/manager/job_manager.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/reduce.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config.h"
#include "server/engine/reduce/fake_bucket_reducer.h"
#include "tests/unit/engine/manager/fake_session_registry.h"
#include "tests/unit/engine/manager/job_manager_fixture.h"
#include "tests/unit/engine/manager/test_rank.h"

namespace gradd {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::vector<TestParam> kSmallModel = {
    {"fc1.weight", {16, 8}, v1::FLOAT32},
    {"fc1.bias", {16}, v1::FLOAT32},
};

class JobManagerTest : public JobManagerFixture {
 protected:
  absl::Status AttachOne(v1::AttachRequest req) {
    return StartAttach(manager(), std::move(req))->Get().status();
  }
};

TEST_F(JobManagerTest, AttachReturnsTheSamePlanToEveryRank) {
  auto ranks = AttachJob("plan", 3, kSmallModel);
  ASSERT_EQ(ranks.size(), 3u);
  for (const auto& r : ranks) {
    const v1::AttachResponse& resp = r->response();
    EXPECT_EQ(resp.world_size(), 3);
    EXPECT_EQ(resp.global_rank(), r->rank());
    EXPECT_EQ(resp.num_nodes(), 1);
    ASSERT_EQ(resp.buckets_size(), 1);  // 576 bytes: one bucket
    // Reverse registration order: the bias comes first.
    EXPECT_THAT(resp.buckets(0).param_indices(), ::testing::ElementsAre(1, 0));
    EXPECT_EQ(resp.buckets(0).size_bytes(), (16 * 8 + 16) * 4u);
    EXPECT_GE(resp.rank_memory_bytes(), resp.buckets(0).size_bytes());
    EXPECT_EQ(resp.control_block_bytes(), ControlLayout(3, 1).job_bytes());
    EXPECT_TRUE(
        r->layout().Validate(r->header(), resp.control_block_bytes()).ok());
  }
  // Distinct attach ids, distinct memory.
  EXPECT_NE(ranks[0]->response().attach_id(), ranks[1]->response().attach_id());
  std::memset(ranks[0]->bucket(0), 0x7f, 4);
  EXPECT_EQ(ranks[1]->bucket(0)[0], 0);
  EXPECT_EQ(manager().NumJobs(), 1);
}

// Every rank writes known values into each bucket, publishes the buckets in
// its own random order, waits, and checks the exact average. Several dtypes
// and small caps give many buckets; values are small integers so averages
// over 4 ranks are exact in every dtype.
TEST_F(JobManagerTest, AveragesEveryBucketInAnyReadyOrder) {
  const std::vector<TestParam> model = {
      {"embed", {300, 4}, v1::FLOAT32},     {"half", {500}, v1::FLOAT16},
      {"fc.weight", {64, 33}, v1::FLOAT32}, {"bf", {257}, v1::BFLOAT16},
      {"dbl", {100}, v1::FLOAT64},          {"fc.bias", {64}, v1::FLOAT32},
      {"empty", {0}, v1::FLOAT32},
  };
  constexpr int kWorld = 4;
  constexpr int kIters = 40;
  auto ranks = AttachJob("avg", kWorld, model, /*bucket_cap_mb=*/0.004,
                         /*first_cap_mb=*/0.001);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  const v1::AttachResponse& plan = ranks[0]->response();
  ASSERT_GE(plan.buckets_size(), 5);

  auto value = [](int rank, int iter, size_t i) -> float {
    return static_cast<float>((rank + 1) * (iter % 5 + 1) + i % 3);
  };
  auto expected = [&](int iter, size_t i) -> double {
    double sum = 0;
    for (int r = 0; r < kWorld; ++r) sum += value(r, iter, i);
    return sum / kWorld;
  };
  auto write = [](DType dtype, char* p, size_t i, float v) {
    switch (dtype) {
      case DType::kFloat32:
        reinterpret_cast<float*>(p)[i] = v;
        break;
      case DType::kFloat64:
        reinterpret_cast<double*>(p)[i] = v;
        break;
      case DType::kFloat16:
        reinterpret_cast<uint16_t*>(p)[i] = FloatToHalf(v);
        break;
      case DType::kBFloat16:
        reinterpret_cast<uint16_t*>(p)[i] = FloatToBFloat16(v);
        break;
    }
  };
  auto read = [](DType dtype, const char* p, size_t i) -> double {
    switch (dtype) {
      case DType::kFloat32:
        return reinterpret_cast<const float*>(p)[i];
      case DType::kFloat64:
        return reinterpret_cast<const double*>(p)[i];
      case DType::kFloat16:
        return HalfToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
      case DType::kBFloat16:
        return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    }
    return 0;
  };

  std::atomic<int> wrong{0};
  std::atomic<int> failures{0};
  auto run_rank = [&](TestRank* rank) {
    std::mt19937 rng(1234 + rank->rank());
    std::vector<int> order(plan.buckets_size());
    for (int it = 1; it <= kIters; ++it) {
      for (size_t b = 0; b < order.size(); ++b) order[b] = b;
      std::shuffle(order.begin(), order.end(), rng);
      for (int b : order) {
        const v1::BucketSpec& spec = plan.buckets(b);
        const DType dtype = static_cast<DType>(spec.dtype());
        const size_t n = spec.size_bytes() / DTypeSize(dtype);
        for (size_t i = 0; i < n; ++i) {
          write(dtype, rank->bucket(b), i, value(rank->rank(), it, i));
        }
        rank->Publish(b, it);
      }
      if (!rank->WaitAllDone(it)) {
        ++failures;
        return;
      }
      for (int b = 0; b < plan.buckets_size(); ++b) {
        const v1::BucketSpec& spec = plan.buckets(b);
        const DType dtype = static_cast<DType>(spec.dtype());
        const size_t n = spec.size_bytes() / DTypeSize(dtype);
        for (size_t i = 0; i < n; ++i) {
          if (read(dtype, rank->bucket(b), i) != expected(it, i)) ++wrong;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (auto& r : ranks) threads.emplace_back(run_rank, r.get());
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << ranks[0]->Error();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(ranks[0]->Error().ok()) << ranks[0]->Error();
  for (int b = 0; b < plan.buckets_size(); ++b) {
    EXPECT_EQ(ranks[0]->Done(b), static_cast<uint64_t>(kIters));
  }
}

// A bucket large enough to be split across the pool's threads.
TEST_F(JobManagerTest, AveragesALargeBucketAcrossThreads) {
  const std::vector<TestParam> model = {{"big", {3 << 20}, v1::FLOAT32}};
  auto ranks = AttachJob("large", 2, model);
  ASSERT_EQ(ranks.size(), 2u);
  const size_t n = 3 << 20;
  for (int it = 1; it <= 3; ++it) {
    for (auto& r : ranks) {
      float* p = reinterpret_cast<float*>(r->bucket(0));
      for (size_t i = 0; i < n; ++i) p[i] = (r->rank() + 1) * it + (i % 1000);
      r->Publish(0, it);
    }
    for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(it)) << r->Error();
    for (auto& r : ranks) {
      const float* p = reinterpret_cast<const float*>(r->bucket(0));
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        bad += p[i] != (3.0f * it + 2 * (i % 1000)) / 2;
      }
      EXPECT_EQ(bad, 0u) << "rank " << r->rank() << " iteration " << it;
    }
  }
}

TEST_F(JobManagerTest, RejectsBadRequestsWithClearErrors) {
  const uint64_t s = sessions_.Open();
  auto req = [&](auto&& mutate) {
    v1::AttachRequest r = MakeRequest("job", 0, 2, s, kSmallModel);
    mutate(r);
    return AttachOne(std::move(r));
  };
  using absl::StatusCode;
  EXPECT_THAT(req([](auto& r) { r.set_job_id(""); }),
              StatusIs(StatusCode::kInvalidArgument, "job id is empty"));
  EXPECT_THAT(req([](auto& r) { r.set_job_id("a b"); }),
              StatusIs(StatusCode::kInvalidArgument, "contains ' '"));
  EXPECT_THAT(req([](auto& r) { r.set_local_rank(2); }),
              StatusIs(StatusCode::kInvalidArgument,
                       "local rank 2 is out of range for local world size 2"));
  EXPECT_THAT(req([](auto& r) { r.set_local_rank(-1); }),
              StatusIs(StatusCode::kInvalidArgument, "local rank -1"));
  EXPECT_THAT(req([](auto& r) { r.set_local_world_size(0); }),
              StatusIs(StatusCode::kInvalidArgument, "local world size 0"));
  EXPECT_THAT(req([](auto& r) { r.set_local_world_size(100000); }),
              StatusIs(StatusCode::kInvalidArgument, "outside 1..256"));
  EXPECT_THAT(req([](auto& r) { r.clear_params(); }),
              StatusIs(StatusCode::kInvalidArgument,
                       "local rank 0 of job 'job' registered no parameters"));
  EXPECT_THAT(
      req([](auto& r) { r.mutable_params(1)->set_dtype(v1::DType(9)); }),
      StatusIs(StatusCode::kInvalidArgument,
               "unsupported dtype  (9) for parameter 'fc1.bias' (index 1)"));
  EXPECT_THAT(req([](auto& r) {
                r.mutable_params(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
              }),
              StatusIs(StatusCode::kInvalidArgument,
                       "unsupported dtype DTYPE_UNSPECIFIED"));
  EXPECT_THAT(req([](auto& r) { r.mutable_params(0)->set_shape(1, -3); }),
              StatusIs(StatusCode::kInvalidArgument,
                       "parameter 'fc1.weight' has a negative dimension"));
  EXPECT_THAT(req([](auto& r) { r.mutable_params(0)->set_name(""); }),
              StatusIs(StatusCode::kInvalidArgument, "empty name"));
  EXPECT_THAT(req([](auto& r) { r.set_bucket_cap_mb(-1); }),
              StatusIs(StatusCode::kInvalidArgument, "bucket_cap_mb = -1"));
  EXPECT_THAT(
      req([](auto& r) { r.mutable_params(0)->set_shape(0, int64_t{1} << 40); }),
      StatusIs(StatusCode::kResourceExhausted, "per-job memory limit"));
  EXPECT_THAT(req([](auto& r) { r.set_num_nodes(-2); }),
              StatusIs(StatusCode::kInvalidArgument, "num_nodes -2"));
  EXPECT_THAT(req([](auto& r) {
                r.set_num_nodes(2);
                r.set_node_rank(2);
              }),
              StatusIs(StatusCode::kInvalidArgument,
                       "node rank 2 is out of range for 2 node(s)"));
  EXPECT_THAT(req([](auto& r) { r.set_node_id("a b"); }),
              StatusIs(StatusCode::kInvalidArgument, "node id 'a b'"));
  EXPECT_THAT(req([](auto& r) { r.set_session_id(999999); }),
              StatusIs(StatusCode::kFailedPrecondition,
                       "session 999999 is not connected"));
  // None of these left a job behind.
  EXPECT_EQ(manager().NumJobs(), 0);
}

TEST_F(JobManagerTest, DuplicateRankAndWorldSizeDisagreement) {
  const uint64_t s0 = sessions_.Open();
  const uint64_t s1 = sessions_.Open();
  const uint64_t s2 = sessions_.Open();
  auto first =
      StartAttach(manager(), MakeRequest("dup", 1, 3, s0, kSmallModel));
  EXPECT_THAT(AttachOne(MakeRequest("dup", 1, 3, s1, kSmallModel)),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "local rank 1 of job 'dup' is already attached"));
  EXPECT_THAT(AttachOne(MakeRequest("dup", 0, 4, s2, kSmallModel)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "says local world size 4 but ranks already attached "
                       "said 3"));
  // The same session cannot be two ranks.
  EXPECT_THAT(AttachOne(MakeRequest("other", 0, 1, s0, kSmallModel)),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       "already attached as local rank 1 of job 'dup'"));
  sessions_.Close(s0);
  EXPECT_THAT(first->Get().status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       "closed its session while attaching"));
  EXPECT_EQ(manager().NumJobs(), 0);
}

TEST_F(JobManagerTest, ModelMismatchNamesParameterAndBothRanks) {
  std::vector<TestParam> other = kSmallModel;
  other[1].shape = {17};
  const uint64_t s0 = sessions_.Open();
  const uint64_t s1 = sessions_.Open();
  const uint64_t s2 = sessions_.Open();
  auto a = StartAttach(manager(), MakeRequest("mm", 0, 3, s0, kSmallModel));
  auto b = StartAttach(manager(), MakeRequest("mm", 1, 3, s1, kSmallModel));
  auto c = StartAttach(manager(), MakeRequest("mm", 2, 3, s2, other));
  const char* expected =
      "local ranks 0 and 2 of job 'mm' registered different models: "
      "parameter 1 is 'fc1.bias' [16] float32 on local rank 0 but "
      "'fc1.bias' [17] float32 on local rank 2";
  for (auto& p : {a, b, c}) {
    EXPECT_THAT(p->Get().status(),
                StatusIs(absl::StatusCode::kInvalidArgument, expected));
  }
  EXPECT_EQ(manager().NumJobs(), 0);
  // The sessions are free again: the job can be attached afresh.
  EXPECT_EQ(AttachJob("mm2", 1, kSmallModel).size(), 1u);
}

TEST_F(JobManagerTest, ModelMismatchInParameterCount) {
  std::vector<TestParam> more = kSmallModel;
  more.push_back({"extra", {3}, v1::FLOAT16});
  const uint64_t s0 = sessions_.Open();
  const uint64_t s1 = sessions_.Open();
  auto a = StartAttach(manager(), MakeRequest("cnt", 0, 2, s0, kSmallModel));
  auto b = StartAttach(manager(), MakeRequest("cnt", 1, 2, s1, more));
  EXPECT_THAT(b->Get().status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "local rank 0 registered 2 parameters and local rank 1 "
                       "registered 3; parameter 2 is 'extra' [3] float16 on "
                       "local rank 1 and missing on local rank 0"));
  EXPECT_FALSE(a->Get().ok());
}

TEST_F(JobManagerTest, AttachTimeoutNamesMissingRanks) {
  config_.set_attach_timeout_ms(200);
  const uint64_t s = sessions_.Open();
  auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(AttachOne(MakeRequest("late", 0, 3, s, kSmallModel)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       "missing local ranks 1, 2 of local world size 3"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(manager().NumJobs(), 0);
}

// Issue 20, point 5: a client that gives up on its pending Attach frees its
// rank at once (not at the attach timeout) and gives its session back to
// the idle timeout; the other ranks keep waiting.
TEST_F(JobManagerTest, CancelledAttachFreesItsRankAndSession) {
  const uint64_t s0 = sessions_.Open();
  const uint64_t s1 = sessions_.Open();
  auto rank0 =
      StartAttach(manager(), MakeRequest("cxl", 0, 3, s0, kSmallModel));
  auto gone = StartAttach(manager(), MakeRequest("cxl", 1, 3, s1, kSmallModel));
  manager().HandleAttachCancelled(s1);
  EXPECT_THAT(gone->Get().status(),
              StatusIs(absl::StatusCode::kCancelled,
                       "local rank 1 of job 'cxl': the client gave up on its "
                       "Attach"));
  EXPECT_EQ(manager().NumJobs(), 1);  // rank 0 still waits
  EXPECT_EQ(sessions_.unclaims(s1), 1);
  EXPECT_EQ(sessions_.unclaims(s0), 0);
  // Nothing pending for the session any more: no effect.
  manager().HandleAttachCancelled(s1);
  EXPECT_EQ(manager().NumJobs(), 1);
  EXPECT_EQ(sessions_.unclaims(s1), 1);

  // Rank 1 again, on the same session, and rank 2: the job forms.
  auto again =
      StartAttach(manager(), MakeRequest("cxl", 1, 3, s1, kSmallModel));
  auto rank2 = StartAttach(
      manager(), MakeRequest("cxl", 2, 3, sessions_.Open(), kSmallModel));
  for (auto& p : {rank0, again, rank2}) EXPECT_TRUE(p->Get().ok());
  // A cancel arriving after the answer leaves the running job alone.
  manager().HandleAttachCancelled(s1);
  EXPECT_EQ(manager().NumJobs(), 1);
  EXPECT_EQ(sessions_.unclaims(s1), 1);

  // The last waiting rank cancelled: the pending job is gone.
  const uint64_t s3 = sessions_.Open();
  auto lone =
      StartAttach(manager(), MakeRequest("lone", 0, 2, s3, kSmallModel));
  manager().HandleAttachCancelled(s3);
  EXPECT_THAT(lone->Get().status(),
              StatusIs(absl::StatusCode::kCancelled, "gave up"));
  EXPECT_EQ(manager().NumJobs(), 1);
  EXPECT_THAT(AttachOne(MakeRequest("lone", 0, 1, s3, kSmallModel)),
              StatusIs(absl::StatusCode::kOk, ""));
}

// A refused or timed-out Attach gives its session back too, so the session
// is closed as idle unless the trainer retries on it.
TEST_F(JobManagerTest, FailedAttachGivesItsSessionBack) {
  config_.set_attach_timeout_ms(100);
  const uint64_t s = sessions_.Open();
  EXPECT_THAT(AttachOne(MakeRequest("late", 0, 2, s, kSmallModel)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "missing"));
  EXPECT_EQ(manager().NumJobs(), 0);
  EXPECT_EQ(sessions_.unclaims(s), 1);
  const uint64_t t = sessions_.Open();
  auto first = StartAttach(manager(), MakeRequest("w", 0, 3, t, kSmallModel));
  const uint64_t u = sessions_.Open();
  EXPECT_THAT(AttachOne(MakeRequest("w", 1, 4, u, kSmallModel)),
              StatusIs(absl::StatusCode::kInvalidArgument, "world size 4"));
  EXPECT_EQ(sessions_.unclaims(u), 1);
  EXPECT_THAT(first->Get().status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded, "missing"));
  EXPECT_EQ(manager().NumJobs(), 0);
  EXPECT_EQ(sessions_.unclaims(t), 1);
}

TEST_F(JobManagerTest, MaxJobsIsEnforced) {
  config_.set_max_jobs(1);
  auto a = StartAttach(manager(),
                       MakeRequest("one", 0, 2, sessions_.Open(), kSmallModel));
  EXPECT_THAT(
      AttachOne(MakeRequest("two", 0, 1, sessions_.Open(), kSmallModel)),
      StatusIs(absl::StatusCode::kResourceExhausted, "maximum of 1 jobs"));
  manager().Shutdown();
  EXPECT_THAT(a->Get().status(),
              StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
}

TEST_F(JobManagerTest, DisconnectDuringIterationFailsTheOthersQuickly) {
  const std::vector<TestParam> model = {{"a", {1000}, v1::FLOAT32},
                                        {"b", {1000}, v1::FLOAT32}};
  auto ranks = AttachJob("dc", 3, model, 0.002, 0.002);
  ASSERT_EQ(ranks.size(), 3u);
  ASSERT_EQ(ranks[0]->response().buckets_size(), 2);
  // One full iteration first.
  for (auto& r : ranks) {
    r->Publish(0, 1);
    r->Publish(1, 1);
  }
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1));
  // Iteration 2: ranks 0 and 2 publish, rank 1 dies before publishing.
  ranks[0]->Publish(0, 2);
  ranks[2]->Publish(0, 2);
  const auto start = std::chrono::steady_clock::now();
  sessions_.Close(ranks[1]->session());
  EXPECT_FALSE(ranks[0]->WaitAllDone(2, std::chrono::seconds(10)));
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(500));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "local rank 1 of job 'dc' disconnected during "
                       "iteration 2"));
  EXPECT_EQ(ranks[2]->Error(), ranks[0]->Error());
  // The others leave too: the job is gone and the id is free.
  sessions_.Close(ranks[0]->session());
  sessions_.Close(ranks[2]->session());
  EXPECT_EQ(manager().NumJobs(), 0);
  auto again = AttachJob("dc", 2, model);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(again[0]->Error().ok());
  EXPECT_EQ(again[0]->Done(0), 0u);
}

TEST_F(JobManagerTest, DisconnectWhileIdleFailsTheNextPublish) {
  auto ranks = AttachJob("idle", 2, kSmallModel);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& r : ranks) r->Publish(0, 1);
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1));
  sessions_.Close(ranks[1]->session());
  EXPECT_EQ(manager().NumJobs(), 1);
  EXPECT_TRUE(ranks[0]->Error().ok());  // nobody waits on rank 1 yet
  ranks[0]->Publish(0, 2);
  EXPECT_FALSE(ranks[0]->WaitAllDone(2, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "local rank 1 of job 'idle' disconnected during "
                       "iteration 2"));
}

TEST_F(JobManagerTest, CleanDetachAfterTheLastIterationIsNoError) {
  auto ranks = AttachJob("bye", 2, kSmallModel);
  ASSERT_EQ(ranks.size(), 2u);
  for (int it = 1; it <= 3; ++it) {
    for (auto& r : ranks) r->Publish(0, it);
    for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(it));
  }
  EXPECT_TRUE(Detach(manager(), "bye", 1, ranks[1]->session()).ok());
  EXPECT_THAT(Detach(manager(), "bye", 1, ranks[1]->session()),
              StatusIs(absl::StatusCode::kNotFound, "is not attached"));
  EXPECT_TRUE(Detach(manager(), "bye", 0, ranks[0]->session()).ok());
  // The job's engine has been joined: the block's final state is settled.
  // The ranks detached, so nobody reads it; a process that still mapped it
  // would read why nothing answers any more.
  EXPECT_EQ(manager().NumJobs(), 0);
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "job 'bye' ended: every local rank detached"));
  // A session that detached may be closed later without effect.
  sessions_.Close(ranks[0]->session());
  EXPECT_EQ(manager().NumJobs(), 0);
}

TEST_F(JobManagerTest, RanksDetachedFromUnderALiveTrainerSeeAnError) {
  // Someone detaches both ranks (e.g. with their session ids) while both
  // trainers still wait: they get an error at once, not a hang.
  auto ranks = AttachJob("torn", 2, kSmallModel);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->Publish(0, 1);
  ranks[1]->Publish(0, 1);
  ASSERT_TRUE(ranks[0]->WaitAllDone(1));
  ranks[0]->Publish(0, 2);
  EXPECT_TRUE(Detach(manager(), "torn", 0, ranks[0]->session()).ok());
  EXPECT_TRUE(Detach(manager(), "torn", 1, ranks[1]->session()).ok());
  EXPECT_FALSE(ranks[0]->WaitAllDone(2, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted, "detached"));
  EXPECT_FALSE(ranks[1]->Error().ok());
}

TEST_F(JobManagerTest, DetachWhileOthersWaitIsAnError) {
  auto ranks = AttachJob("early", 2, kSmallModel);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->Publish(0, 1);
  EXPECT_TRUE(Detach(manager(), "early", 1, ranks[1]->session()).ok());
  EXPECT_FALSE(ranks[0]->WaitAllDone(1, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kAborted,
                       "local rank 1 of job 'early' detached during "
                       "iteration 1"));
}

TEST_F(JobManagerTest, ReadySequenceSkippingAheadFailsOnlyThatJob) {
  auto bad = AttachJob("bad", 2, kSmallModel);
  auto good = AttachJob("good", 2, kSmallModel);
  ASSERT_EQ(bad.size(), 2u);
  ASSERT_EQ(good.size(), 2u);
  bad[0]->Publish(0, 3);
  EXPECT_FALSE(bad[1]->WaitAllDone(1, std::chrono::seconds(10)));
  EXPECT_THAT(bad[1]->Error(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "local rank 0 of job 'bad' published bucket 0 for "
                       "iteration 3 while iteration 1 is in progress"));
  for (int it = 1; it <= 5; ++it) {
    for (auto& r : good) r->Publish(0, it);
    for (auto& r : good) ASSERT_TRUE(r->WaitAllDone(it)) << r->Error();
  }
  EXPECT_TRUE(good[0]->Error().ok());
}

TEST_F(JobManagerTest, BroadcastCopiesTheRootsAreaToEveryRank) {
  constexpr uint64_t kArea = 10000;
  auto ranks = AttachJob("bc", 3, kSmallModel, 0, 0, kArea);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0]->response().broadcast_bytes(), kArea);
  EXPECT_GE(ranks[0]->response().rank_memory_bytes(),
            ranks[0]->response().broadcast_offset() + kArea);
  for (uint64_t op = 1; op <= 3; ++op) {
    const int root = static_cast<int>(op % 3);
    const uint64_t bytes = 1000 * op + 7;
    for (uint64_t i = 0; i < bytes; ++i) {
      ranks[root]->broadcast_area()[i] = static_cast<char>(i * op + root);
    }
    for (auto& r : ranks) r->PublishBroadcast(op, root, bytes);
    for (auto& r : ranks) {
      ASSERT_TRUE(r->WaitBroadcast(op)) << r->Error();
      EXPECT_EQ(std::memcmp(r->broadcast_area(), ranks[root]->broadcast_area(),
                            bytes),
                0)
          << "rank " << r->rank() << " op " << op;
    }
  }
  // Broadcasts interleave with gradient iterations.
  for (auto& r : ranks) r->Publish(0, 1);
  for (auto& r : ranks) EXPECT_TRUE(r->WaitAllDone(1));
}

TEST_F(JobManagerTest, BroadcastDisagreementIsAnError) {
  auto ranks = AttachJob("bcx", 2, kSmallModel, 0, 0, 4096);
  ASSERT_EQ(ranks.size(), 2u);
  ranks[0]->PublishBroadcast(1, 0, 100);
  ranks[1]->PublishBroadcast(1, 1, 100);
  EXPECT_FALSE(ranks[0]->WaitBroadcast(1, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[0]->Error(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "ranks disagree on broadcast 1: local rank 0 asks for "
                       "root 0, 100 bytes; local rank 1 for root 1, 100 "
                       "bytes"));
}

TEST_F(JobManagerTest, BroadcastLargerThanTheAreaIsAnError) {
  auto ranks = AttachJob("bcbig", 2, kSmallModel, 0, 0, 64);
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& r : ranks) r->PublishBroadcast(1, 0, 65);
  EXPECT_FALSE(ranks[1]->WaitBroadcast(1, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[1]->Error(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "exceeds the job's broadcast area of 64 bytes"));
}

TEST_F(JobManagerTest, ShutdownPublishesAnErrorToEveryJob) {
  auto a = AttachJob("a", 2, kSmallModel);
  auto b = AttachJob("b", 1, kSmallModel);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 1u);
  a[0]->Publish(0, 1);  // a rank waiting mid-iteration
  manager().Shutdown();
  EXPECT_FALSE(a[0]->WaitAllDone(1, std::chrono::seconds(10)));
  EXPECT_THAT(a[0]->Error(), StatusIs(absl::StatusCode::kUnavailable,
                                      "job 'a': gradd daemon shutting down"));
  EXPECT_THAT(b[0]->Error(), StatusIs(absl::StatusCode::kUnavailable,
                                      "gradd daemon shutting down"));
  EXPECT_THAT(AttachOne(MakeRequest("c", 0, 1, sessions_.Open(), kSmallModel)),
              StatusIs(absl::StatusCode::kUnavailable, "shutting down"));
}

TEST_F(JobManagerTest, RunningJobRefusesNewRanks) {
  auto ranks = AttachJob("run", 2, kSmallModel);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_THAT(
      AttachOne(MakeRequest("run", 1, 2, sessions_.Open(), kSmallModel)),
      StatusIs(absl::StatusCode::kAlreadyExists,
               "local rank 1 of job 'run' is already attached"));
  sessions_.Close(ranks[1]->session());
  EXPECT_THAT(
      AttachOne(MakeRequest("run", 1, 2, sessions_.Open(), kSmallModel)),
      StatusIs(absl::StatusCode::kFailedPrecondition, "job 'run' is running"));
}

TEST_F(JobManagerTest, ReducerCompletesFromAnotherThreadAndCanFail) {
  // Completes only when the test says so, from the test's thread: the
  // contract the multi-node (network-thread) reducer relies on.
  std::shared_ptr<FakeReductions> reducer;
  manager_ = std::make_unique<JobManager>(
      config_, &sessions_, &pool_,
      [&](const JobSpec& spec)
          -> absl::StatusOr<std::unique_ptr<BucketReducerInterface>> {
        reducer = std::make_shared<FakeReductions>();
        return std::make_unique<FakeBucketReducer>(reducer);
      });
  sessions_.set_observer(manager_.get());
  auto ranks = AttachJob("deferred", 2, kSmallModel);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_NE(reducer, nullptr);

  for (auto& r : ranks) r->Publish(0, 1);
  std::vector<FakeReductions::Work> started = reducer->Take(1);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].bucket, 0);
  EXPECT_EQ(started[0].iteration, 1u);
  EXPECT_EQ(ranks[0]->Done(0), 0u);  // not done until the reducer says so
  std::move(started[0].done)(absl::OkStatus());
  for (auto& r : ranks) ASSERT_TRUE(r->WaitAllDone(1)) << r->Error();

  for (auto& r : ranks) r->Publish(0, 2);
  started = reducer->Take(1);
  ASSERT_EQ(started.size(), 1u);
  EXPECT_EQ(started[0].iteration, 2u);
  std::move(started[0].done)(absl::UnavailableError("peer node 'n1' is gone"));
  EXPECT_FALSE(ranks[1]->WaitAllDone(2, std::chrono::seconds(10)));
  EXPECT_THAT(ranks[1]->Error(),
              StatusIs(absl::StatusCode::kUnavailable,
                       "job 'deferred' bucket 0 iteration 2: peer node 'n1' "
                       "is gone"));
}

}  // namespace
}  // namespace gradd
