// The reducers' join support over FakeCollectiveBackend (two "nodes" as
// threads): the join round goes to the network before bucket 0 of its
// iteration, a node with no contributing rank still runs every bucket's
// collective with zeros (and writes nothing), the divisor comes per bucket,
// and a broadcast skips ranks that take no part.
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/fake_collective_backend.h"
#include "server/engine/reduce/bucket_reducer.h"
#include "server/engine/reduce/hierarchical_reducer.h"

namespace gradd {
namespace {

constexpr size_t kCount = 1000;

// Waits for one completion and keeps its status (and round values).
struct Done {
  absl::Notification note;
  absl::Status status;
  std::vector<double> values;
  BucketReducerInterface::Completion Bucket() {
    return [this](absl::Status s) {
      status = std::move(s);
      note.Notify();
    };
  }
  BucketReducerInterface::RoundCompletion Round() {
    return [this](absl::Status s, std::vector<double> v) {
      status = std::move(s);
      values = std::move(v);
      note.Notify();
    };
  }
  absl::Status Wait() {
    if (!note.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      return absl::DeadlineExceededError("test: no completion");
    }
    return status;
  }
};

std::unique_ptr<HierarchicalReducer> MakeReducer(
    std::unique_ptr<FakeCollectiveBackend> backend, int num_buckets,
    size_t chunk_bytes, HierarchicalReducer::Options::Scheduling scheduling) {
  HierarchicalReducer::Options options;
  options.scheduling = scheduling;
  options.num_buckets = num_buckets;
  options.node_offsets = {0, 2};
  options.world_size = 4;
  options.chunk_bytes = chunk_bytes;
  return std::make_unique<HierarchicalReducer>(options, std::move(backend));
}

// (chunk bytes, scheduling).
class JoinReducerTest
    : public ::testing::TestWithParam<
          std::tuple<size_t, HierarchicalReducer::Options::Scheduling>> {
 protected:
  size_t chunk_bytes() const { return std::get<0>(GetParam()); }
};

// Node 0's two ranks have joined; node 1's ranks 2 and 3 are active and
// write 2 and 6: with divisor 2 (active ranks) each gets (2 + 6) / 2.
TEST_P(JoinReducerTest, IdleNodeMatchesCollectivesWithZeros) {
  auto backends = FakeCollectiveBackend::CreateGroup(2, absl::Seconds(10));
  FakeCollectiveBackend* fake0 = backends[0].get();
  std::unique_ptr<HierarchicalReducer> r0 = MakeReducer(
      std::move(backends[0]), 2, chunk_bytes(), std::get<1>(GetParam()));
  std::unique_ptr<HierarchicalReducer> r1 = MakeReducer(
      std::move(backends[1]), 2, chunk_bytes(), std::get<1>(GetParam()));

  // active[b][r]: bucket b of node 1's local rank r.
  std::vector<std::vector<std::vector<float>>> active(
      2, std::vector<std::vector<float>>(2, std::vector<float>(kCount)));
  std::vector<void*> none;
  std::vector<std::vector<void*>> ranks1(2);
  for (int b = 0; b < 2; ++b) {
    std::fill(active[b][0].begin(), active[b][0].end(), 2.0f);
    std::fill(active[b][1].begin(), active[b][1].end(), 6.0f);
    ranks1[b] = {active[b][0].data(), active[b][1].data()};
  }

  auto node = [&](int k, HierarchicalReducer* r) {
    // The round: node k reports its ranks (-1 joined, 1 active).
    JoinRoundWork round;
    round.iteration = 1;
    round.values = k == 0 ? std::vector<double>{-1, -1, 0, 0}
                          : std::vector<double>{0, 0, 1, 1};
    Done rd;
    r->StartJoinRound(std::move(round), rd.Round());
    EXPECT_TRUE(rd.Wait().ok()) << rd.status;
    EXPECT_THAT(rd.values, ::testing::ElementsAre(-1, -1, 1, 1));
    Done d[2];
    for (int b = 1; b >= 0; --b) {  // out of plan order on purpose
      BucketWork work;
      work.bucket = b;
      work.iteration = 1;
      work.dtype = DType::kFloat32;
      work.count = kCount;
      work.rank_buffers = k == 0 ? &none : &ranks1[b];
      work.divisor = 2;
      r->Start(work, d[b].Bucket());
    }
    for (int b = 0; b < 2; ++b) {
      EXPECT_TRUE(d[b].Wait().ok()) << d[b].status;
    }
  };
  std::thread t0([&] { node(0, r0.get()); });
  std::thread t1([&] { node(1, r1.get()); });
  t0.join();
  t1.join();
  // The round, then each bucket whole or in 4 chunks of 256 elements.
  EXPECT_EQ(fake0->allreduce_calls(), chunk_bytes() == 0 ? 3 : 9);
  for (int b = 0; b < 2; ++b) {
    for (int r = 0; r < 2; ++r) {
      for (float v : active[b][r]) ASSERT_EQ(v, 4.0f) << "bucket " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    WholeAndChunked, JoinReducerTest,
    ::testing::Combine(
        ::testing::Values(0, 1024),
        ::testing::Values(
            HierarchicalReducer::Options::Scheduling::kPlanOrder,
            HierarchicalReducer::Options::Scheduling::kPriority)));

TEST(FusedReducerJoinTest, DividesByTheWorksDivisorOverItsBuffersOnly) {
  FusedReducer reducer(nullptr, 3);
  std::vector<float> a(8, 1.0f), b(8, 5.0f), joined(8, 7.0f);
  std::vector<void*> buffers = {a.data(), b.data()};
  BucketWork work;
  work.dtype = DType::kFloat32;
  work.count = 8;
  work.rank_buffers = &buffers;
  work.divisor = 4;
  absl::Status status = absl::UnknownError("not called");
  reducer.Start(work, [&](absl::Status s) { status = s; });
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(a[0], 1.5f);
  EXPECT_EQ(b[7], 1.5f);
  EXPECT_EQ(joined[0], 7.0f);
}

TEST(FusedReducerJoinTest, BroadcastSkipsRanksThatTakeNoPart) {
  FusedReducer reducer(nullptr, 3);
  std::vector<char> a(4, 'a'), b(4, 'b'), c(4, 'c');
  std::vector<void*> areas = {a.data(), nullptr, c.data()};
  BroadcastWork work;
  work.seq = 1;
  work.root = 2;
  work.bytes = 4;
  work.rank_areas = &areas;
  absl::Status status = absl::UnknownError("not called");
  reducer.StartBroadcast(work, [&](absl::Status s) { status = s; });
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(a[0], 'c');
  EXPECT_EQ(b[0], 'b');
}

TEST(FusedReducerJoinTest, RoundOnOneNodeIsTheNodesOwn) {
  FusedReducer reducer(nullptr, 2);
  JoinRoundWork round;
  round.iteration = 3;
  round.values = {3, 1, 0, 1, -1, 5};
  std::vector<double> got;
  reducer.StartJoinRound(std::move(round),
                         [&](absl::Status s, std::vector<double> v) {
                           EXPECT_TRUE(s.ok());
                           got = std::move(v);
                         });
  EXPECT_THAT(got, ::testing::ElementsAre(3, 1, 0, 1, -1, 5));
}

}  // namespace
}  // namespace gradd
