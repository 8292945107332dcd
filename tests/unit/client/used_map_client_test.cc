// UsedMapClient over a fake inner client (one rank, so "the average" is this
// rank's own memory): index translation, what lands in the hidden map and
// when it is handed over, MarkUnused's zero/keep, errors naming the caller's
// indices. The reduction across ranks is covered by tests/python/
// test_used_map.py and the C ABI by tests/integration (real daemons).
#include "client/src/data/used_map_client.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gradd/client.h"
#include "gtest/gtest.h"

namespace gradd {

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Float32 parameters of the given sizes in one bucket each; parameter 0 is
// the used map. Records the order of MarkReady calls and what the map held
// when it was marked.
class FakeClient final : public Client {
 public:
  explicit FakeClient(std::vector<size_t> sizes) {
    for (size_t n : sizes) memory_.emplace_back(n, 0.0f);
    for (size_t i = 0; i < sizes.size(); ++i) {
      buckets_.push_back(BucketInfo{1, sizes[i] * 4, {static_cast<int>(i)}});
    }
    marked_.assign(sizes.size(), false);
  }

  void* gradient(int p) const override {
    return const_cast<float*>(memory_[p].data());
  }
  size_t gradient_bytes(int p) const override { return memory_[p].size() * 4; }
  int num_params() const override { return static_cast<int>(memory_.size()); }
  absl::Status MarkReady(int p) override {
    if (marked_[p]) return absl::FailedPreconditionError("inner: twice");
    marked_[p] = true;
    order.push_back(p);
    if (p == 0) map_when_marked = memory_[0];
    return absl::OkStatus();
  }
  absl::Status WaitAll() override {
    for (bool m : marked_) {
      if (!m) return absl::FailedPreconditionError("inner: unmarked");
    }
    marked_.assign(marked_.size(), false);
    ++iteration_;
    if (abort_next) {
      abort_next = false;
      absl::Status s = absl::AbortedError("iteration aborted (fake)");
      s.SetPayload(kIterationAbortedPayload, absl::Cord("1"));
      return s;
    }
    return absl::OkStatus();
  }
  // Rank restart: fixed answers, to see that the decorator forwards them.
  bool restarted() const override { return true; }
  uint32_t rank_restart_grace_ms() const override { return 1234; }
  bool StateSyncPending() const override { return true; }
  absl::StatusOr<int> BeginStateSync() override { return 5; }
  uint64_t iterations_aborted() const override { return 7; }
  uint64_t restarts() const override { return 8; }
  bool BucketDone(int) const override { return false; }
  absl::Status Broadcast(void*, size_t, int) override {
    return absl::OkStatus();
  }
  absl::Status JoinEnter(const JoinOptions&) override {
    return absl::UnimplementedError("fake");
  }
  bool in_join() const override { return false; }
  absl::Status JoinActive(void*, size_t) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<JoinResult> Join() override {
    return absl::UnimplementedError("fake");
  }
  absl::Status SetCommHook(const CommHookOptions&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<bool> RebuildBuckets() override { return false; }
  bool buckets_rebuilt() const override { return false; }
  std::vector<int32_t> ready_order() const override { return {}; }
  absl::Status Detach() override { return absl::OkStatus(); }
  int num_buckets() const override { return static_cast<int>(buckets_.size()); }
  const BucketInfo& bucket(int b) const override { return buckets_[b]; }
  uint64_t iteration() const override { return iteration_; }
  int global_rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_world_size() const override { return 1; }

  std::vector<int> order;
  std::vector<float> map_when_marked;
  bool abort_next = false;
  std::vector<std::vector<float>> memory_;

 private:
  std::vector<BucketInfo> buckets_;
  std::vector<bool> marked_;
  uint64_t iteration_ = 1;
};

struct Fixture {
  Fixture() {
    auto inner = std::make_unique<FakeClient>(std::vector<size_t>{3, 2, 4, 1});
    fake = inner.get();
    client = NewUsedMapClient(std::move(inner), {"a", "b", "c"}, "job 'j'");
  }
  float* grad(int i) { return static_cast<float*>(client->gradient(i)); }
  FakeClient* fake;
  std::unique_ptr<Client> client;
};

TEST(UsedMapClientTest, HidesTheMap) {
  Fixture f;
  EXPECT_EQ(f.client->num_params(), 3);
  EXPECT_EQ(f.client->gradient(0), f.fake->gradient(1));
  EXPECT_EQ(f.client->gradient_bytes(2), 4u);
  EXPECT_EQ(f.client->gradient(3), nullptr);
  EXPECT_EQ(f.client->gradient(-1), nullptr);
  EXPECT_TRUE(f.client->bucket(0).params.empty());  // the map's bucket
  EXPECT_THAT(f.client->bucket(1).params, ElementsAre(0));
  EXPECT_THAT(f.client->bucket(3).params, ElementsAre(2));
  EXPECT_EQ(f.client->MarkReady(3).code(), absl::StatusCode::kOutOfRange);
}

TEST(UsedMapClientTest, MapCarriesUseAndGoesLast) {
  Fixture f;
  for (int i = 0; i < 3; ++i) f.grad(i)[0] = 7.0f;
  ASSERT_TRUE(f.client->MarkReady(2).ok());
  ASSERT_TRUE(f.client->MarkUnused(0).ok());  // zeroes
  ASSERT_TRUE(f.client->MarkUnused(1, UnusedGradient::kKeep).ok());
  ASSERT_TRUE(f.client->WaitAll().ok());
  EXPECT_THAT(f.fake->order, ElementsAre(3, 1, 2, 0));
  EXPECT_THAT(f.fake->map_when_marked, ElementsAre(0.0f, 0.0f, 1.0f));
  EXPECT_EQ(f.grad(0)[0], 0.0f);
  EXPECT_EQ(f.grad(1)[0], 7.0f);
  EXPECT_FALSE(f.client->GloballyUsed(0));
  EXPECT_FALSE(f.client->GloballyUsed(1));
  EXPECT_TRUE(f.client->GloballyUsed(2));
  EXPECT_FALSE(f.client->GloballyUsed(3));
  // The next iteration starts from a clean map.
  EXPECT_THAT(f.fake->memory_[0], ElementsAre(0.0f, 0.0f, 0.0f));
}

TEST(UsedMapClientTest, SkipHandsTheMapOverFirst) {
  Fixture f;
  ASSERT_TRUE(f.client->SkipUsedMap().ok());
  ASSERT_TRUE(f.client->SkipUsedMap().ok());  // once per iteration
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.client->MarkUnused(i).ok());
  ASSERT_TRUE(f.client->WaitAll().ok());
  EXPECT_THAT(f.fake->order, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(f.fake->map_when_marked, ElementsAre(1.0f, 1.0f, 1.0f));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(f.client->GloballyUsed(i));
}

TEST(UsedMapClientTest, ErrorsNameTheCallersIndices) {
  Fixture f;
  ASSERT_TRUE(f.client->MarkReady(1).ok());
  absl::Status twice = f.client->MarkUnused(1);
  EXPECT_EQ(twice.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr("'b' (index 1)"));
  absl::Status missing = f.client->WaitAll();
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.message(), HasSubstr("2 of 3 parameters"));
  EXPECT_THAT(missing.message(), HasSubstr("'a' (index 0), 'c' (index 2)"));
  EXPECT_THAT(f.fake->order, ElementsAre(2));  // the map was not handed over
  ASSERT_TRUE(f.client->MarkReady(0).ok());
  ASSERT_TRUE(f.client->MarkReady(2).ok());
  EXPECT_TRUE(f.client->WaitAll().ok());
}

TEST(UsedMapClientTest, AbortedIterationClearsTheMapAndKeepsTheLastAnswer) {
  Fixture f;
  ASSERT_TRUE(f.client->MarkReady(0).ok());
  ASSERT_TRUE(f.client->MarkUnused(1).ok());
  ASSERT_TRUE(f.client->MarkUnused(2).ok());
  ASSERT_TRUE(f.client->WaitAll().ok());
  ASSERT_TRUE(f.client->GloballyUsed(0));
  // Iteration 2 is aborted by a rank restart: no averages came back, so
  // the answer of iteration 1 stays, and iteration 3 starts clean.
  ASSERT_TRUE(f.client->MarkUnused(0).ok());
  ASSERT_TRUE(f.client->MarkReady(1).ok());
  ASSERT_TRUE(f.client->MarkReady(2).ok());
  f.fake->abort_next = true;
  absl::Status s = f.client->WaitAll();
  EXPECT_TRUE(IsIterationAborted(s)) << s;
  EXPECT_THAT(f.fake->memory_[0], ElementsAre(0.0f, 0.0f, 0.0f));
  EXPECT_TRUE(f.client->GloballyUsed(0));
  EXPECT_FALSE(f.client->GloballyUsed(1));
  EXPECT_EQ(f.client->iteration(), 3u);
  // The retried batch goes through.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.client->MarkReady(i).ok());
  EXPECT_TRUE(f.client->WaitAll().ok());
  EXPECT_THAT(f.fake->map_when_marked, ElementsAre(1.0f, 1.0f, 1.0f));
}

TEST(UsedMapClientTest, ForwardsRankRestart) {
  Fixture f;
  EXPECT_TRUE(f.client->restarted());
  EXPECT_EQ(f.client->rank_restart_grace_ms(), 1234u);
  EXPECT_TRUE(f.client->StateSyncPending());
  absl::StatusOr<int> root = f.client->BeginStateSync();
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(*root, 5);
  EXPECT_EQ(f.client->iterations_aborted(), 7u);
  EXPECT_EQ(f.client->restarts(), 8u);
}

}  // namespace
}  // namespace gradd
