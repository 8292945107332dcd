// Collective rounds on the ranks' areas
// (server/engine/reduce/area_collective.h): the single-node path, and several
// "nodes" as threads, each with a HierarchicalReducer over
// FakeCollectiveBackend and its own local ranks' areas, checking every value;
// nodes that disagree on a round fail it.
#include "server/engine/reduce/area_collective.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/reduce.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/backends/fake_collective_backend.h"
#include "server/engine/reduce/hierarchical_reducer.h"

namespace gradd {
namespace {

using ::testing::HasSubstr;

constexpr size_t kArea = 4096;

struct Areas {
  explicit Areas(int n) : storage(n, std::vector<char>(kArea)) {
    for (auto& s : storage) ptrs.push_back(s.data());
  }
  template <typename T>
  T* at(int r) {
    return reinterpret_cast<T*>(storage[r].data());
  }
  std::vector<std::vector<char>> storage;
  std::vector<void*> ptrs;
};

BroadcastWork Work(Areas& areas, CollectiveKind kind, size_t bytes,
                   int first_rank, int world) {
  BroadcastWork w;
  w.seq = 1;
  w.kind = kind;
  w.bytes = bytes;
  w.rank_areas = &areas.ptrs;
  w.first_rank = first_rank;
  w.world_size = world;
  return w;
}

TEST(AreaCollectiveTest, SingleNodeAllreduceOfIntegers) {
  Areas a(3);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) a.at<int32_t>(r)[i] = (r + 1) * (i - 2);
  }
  BroadcastWork w = Work(a, CollectiveKind::kAllreduce, 5 * 4, 0, 3);
  w.dtype = CollectiveDType::kInt32;
  w.op = CollectiveOp::kMin;
  std::vector<char> scratch;
  RunLocalAreaCollective(w, &scratch);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(a.at<int32_t>(r)[i], i < 2 ? 3 * (i - 2) : i - 2)
          << "rank " << r << " element " << i;
    }
  }
}

TEST(AreaCollectiveTest, SingleNodeAllgatherPlacesBlocksByGlobalRank) {
  Areas a(2);
  std::memcpy(a.at<char>(0), "abc", 3);
  std::memcpy(a.at<char>(1), "xyz", 3);
  // This node holds global ranks 1 and 2 of 4 (no network here: the other
  // ranks' blocks stay zero).
  BroadcastWork w = Work(a, CollectiveKind::kAllgather, 3, 1, 4);
  std::vector<char> scratch;
  RunLocalAreaCollective(w, &scratch);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::string(a.at<char>(r), 12),
              std::string("\0\0\0abcxyz\0\0\0", 12));
  }
  EXPECT_EQ(AreaBytesNeeded(CollectiveKind::kAllgather, 3, 4), 12u);
  EXPECT_EQ(AreaBytesNeeded(CollectiveKind::kAllreduce, 3, 4), 3u);
  EXPECT_EQ(AreaBytesNeeded(CollectiveKind::kAllgather, SIZE_MAX / 2, 4),
            SIZE_MAX);
}

// Nodes with local worlds {2, 1}: global ranks 0, 1 on node 0, 2 on node 1.
class MultiNodeAreaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backends = FakeCollectiveBackend::CreateGroup(2, absl::Seconds(10),
                                                       {"alpha", "beta"});
    for (int k = 0; k < 2; ++k) {
      HierarchicalReducer::Options o;
      o.num_buckets = 0;
      o.node_offsets = {0, 2};
      o.world_size = 3;
      reducers_.push_back(
          std::make_unique<HierarchicalReducer>(o, std::move(backends[k])));
    }
    areas_.emplace_back(2);
    areas_.emplace_back(1);
  }

  // Runs `work(k)` on both nodes at once; their statuses.
  std::vector<absl::Status> Run(const std::function<BroadcastWork(int)>& work) {
    std::vector<absl::Status> out(2);
    std::vector<std::thread> threads;
    for (int k = 0; k < 2; ++k) {
      threads.emplace_back([&, k] {
        absl::Notification done;
        reducers_[k]->StartBroadcast(work(k), [&](absl::Status s) {
          out[k] = s;
          done.Notify();
        });
        if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
          out[k] = absl::DeadlineExceededError("test: no completion");
        }
      });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  std::vector<std::unique_ptr<HierarchicalReducer>> reducers_;
  std::vector<Areas> areas_;
};

TEST_F(MultiNodeAreaTest, AllreduceEveryOpAcrossNodes) {
  const int offsets[] = {0, 2};
  for (CollectiveOp op : {CollectiveOp::kSum, CollectiveOp::kMax}) {
    for (int k = 0; k < 2; ++k) {
      for (size_t r = 0; r < areas_[k].ptrs.size(); ++r) {
        const int g = offsets[k] + static_cast<int>(r);
        for (int i = 0; i < 100; ++i) {
          areas_[k].at<int64_t>(r)[i] = (g + 1) * (i - 50) * (int64_t{1} << 33);
        }
      }
    }
    std::vector<absl::Status> s = Run([&](int k) {
      BroadcastWork w =
          Work(areas_[k], CollectiveKind::kAllreduce, 800, offsets[k], 3);
      w.dtype = CollectiveDType::kInt64;
      w.op = op;
      return w;
    });
    ASSERT_TRUE(s[0].ok()) << s[0];
    ASSERT_TRUE(s[1].ok()) << s[1];
    for (int k = 0; k < 2; ++k) {
      for (size_t r = 0; r < areas_[k].ptrs.size(); ++r) {
        for (int i = 0; i < 100; ++i) {
          const int64_t f = (i - 50) * (int64_t{1} << 33);
          const int64_t want = op == CollectiveOp::kSum ? 6 * f
                               : f >= 0                 ? 3 * f
                                                        : f;
          ASSERT_EQ(areas_[k].at<int64_t>(r)[i], want)
              << "node " << k << " rank " << r << " element " << i;
        }
      }
    }
  }
  // float16 average: each node's sum in float32, one rounding at the end.
  for (int k = 0; k < 2; ++k) {
    for (size_t r = 0; r < areas_[k].ptrs.size(); ++r) {
      const int g = offsets[k] + static_cast<int>(r);
      areas_[k].at<uint16_t>(r)[0] = FloatToHalf(static_cast<float>(g + 1));
    }
  }
  std::vector<absl::Status> s = Run([&](int k) {
    BroadcastWork w =
        Work(areas_[k], CollectiveKind::kAllreduce, 2, offsets[k], 3);
    w.dtype = CollectiveDType::kFloat16;
    w.op = CollectiveOp::kAvg;
    return w;
  });
  ASSERT_TRUE(s[0].ok() && s[1].ok()) << s[0] << " / " << s[1];
  EXPECT_EQ(HalfToFloat(areas_[1].at<uint16_t>(0)[0]), 2.0f);
  EXPECT_EQ(HalfToFloat(areas_[0].at<uint16_t>(1)[0]), 2.0f);
}

TEST_F(MultiNodeAreaTest, AllgatherAndBarrierAcrossNodes) {
  const int offsets[] = {0, 2};
  for (int k = 0; k < 2; ++k) {
    for (size_t r = 0; r < areas_[k].ptrs.size(); ++r) {
      const int g = offsets[k] + static_cast<int>(r);
      for (int i = 0; i < 7; ++i) {
        areas_[k].at<uint8_t>(r)[i] = static_cast<uint8_t>(g * 10 + i);
      }
    }
  }
  std::vector<absl::Status> s = Run([&](int k) {
    return Work(areas_[k], CollectiveKind::kAllgather, 7, offsets[k], 3);
  });
  ASSERT_TRUE(s[0].ok() && s[1].ok()) << s[0] << " / " << s[1];
  for (int k = 0; k < 2; ++k) {
    for (size_t r = 0; r < areas_[k].ptrs.size(); ++r) {
      for (int g = 0; g < 3; ++g) {
        for (int i = 0; i < 7; ++i) {
          ASSERT_EQ(areas_[k].at<uint8_t>(r)[g * 7 + i], g * 10 + i)
              << "node " << k << " rank " << r << " block " << g;
        }
      }
    }
  }
  s = Run([&](int k) {
    return Work(areas_[k], CollectiveKind::kBarrier, 0, offsets[k], 3);
  });
  EXPECT_TRUE(s[0].ok() && s[1].ok()) << s[0] << " / " << s[1];
}

TEST_F(MultiNodeAreaTest, NodesThatDisagreeFailTheRound) {
  std::vector<absl::Status> s = Run([&](int k) {
    BroadcastWork w =
        Work(areas_[k], CollectiveKind::kAllreduce, 40, k == 0 ? 0 : 2, 3);
    w.dtype = CollectiveDType::kFloat32;
    w.op = k == 0 ? CollectiveOp::kSum : CollectiveOp::kMin;
    return w;
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(s[k].code(), absl::StatusCode::kInvalidArgument) << s[k];
    EXPECT_THAT(s[k].message(),
                HasSubstr("the nodes disagree on collective round 1"));
    EXPECT_THAT(s[k].message(), HasSubstr("op ranges over 0..2"));
  }
}

}  // namespace
}  // namespace gradd
