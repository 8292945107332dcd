// HierarchicalReducer::Replan (bucket rebuild): two "nodes" as threads over
// FakeCollectiveBackend (which fails any call whose kind or size differs
// between nodes) switch from a 2-bucket plan to a 3-bucket plan with other
// sizes and dtypes at an iteration boundary; buckets are started in reverse
// order, so only the reducer's ordering rule (plan order or the nodes'
// priority agreement) lines the collectives up.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/reduce.h"
#include "gtest/gtest.h"
#include "server/backends/fake_collective_backend.h"
#include "server/engine/reduce/hierarchical_reducer.h"

namespace gradd {
namespace {

struct Plan {
  std::vector<DType> dtypes;
  std::vector<size_t> counts;
};

double Want(uint64_t t, int b, size_t j) {
  return static_cast<double>(
             static_cast<int64_t>((3 * j + 7 * t + 13 * b) % 61) - 30) *
         0.5;
}

void Put(void* buf, DType dtype, size_t j, double v) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(buf)[j] = static_cast<float>(v);
  } else {
    static_cast<uint16_t*>(buf)[j] = FloatToHalf(static_cast<float>(v));
  }
}
double Get(const void* buf, DType dtype, size_t j) {
  return dtype == DType::kFloat32
             ? static_cast<const float*>(buf)[j]
             : HalfToFloat(static_cast<const uint16_t*>(buf)[j]);
}

// One node's engine: iterations 1..2 on plan `a`, Replan, 3..5 on `b`.
std::string RunNode(HierarchicalReducer& reducer, int node, const Plan& a,
                    const Plan& b) {
  for (uint64_t t = 1; t <= 5; ++t) {
    const Plan& plan = t <= 2 ? a : b;
    if (t == 3) reducer.Replan(3, static_cast<int>(b.counts.size()));
    const int n = static_cast<int>(plan.counts.size());
    std::vector<std::vector<char>> storage(n);
    std::vector<std::vector<void*>> buffers(n);
    for (int k = 0; k < n; ++k) {
      storage[k].resize(plan.counts[k] * DTypeSize(plan.dtypes[k]));
      buffers[k] = {storage[k].data()};
      for (size_t j = 0; j < plan.counts[k]; ++j) {
        // Global ranks 0 and 1: the rank terms -1/2 and +1/2 cancel.
        Put(storage[k].data(), plan.dtypes[k], j, Want(t, k, j) + node - 0.5);
      }
    }
    absl::Mutex mu;
    int done = 0;
    absl::Status first;
    for (int k = n - 1; k >= 0; --k) {
      BucketWork work;
      work.bucket = k;
      work.iteration = t;
      work.dtype = plan.dtypes[k];
      work.count = plan.counts[k];
      work.rank_buffers = &buffers[k];
      reducer.Start(work, [&](absl::Status s) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = s;
        ++done;
      });
    }
    {
      absl::MutexLock lock(&mu);
      auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == n; };
      if (!mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(20))) {
        return absl::StrCat("iteration ", t, ": completions missing");
      }
      if (!first.ok())
        return absl::StrCat("iteration ", t, ": ", first.ToString());
    }
    for (int k = 0; k < n; ++k) {
      for (size_t j = 0; j < plan.counts[k]; ++j) {
        if (Get(storage[k].data(), plan.dtypes[k], j) != Want(t, k, j)) {
          return absl::StrCat("iteration ", t, " bucket ", k, "[", j,
                              "] is not the average");
        }
      }
    }
  }
  return "";
}

class HierarchicalReplanTest : public ::testing::TestWithParam<
                                   HierarchicalReducer::Options::Scheduling> {};

TEST_P(HierarchicalReplanTest, SwitchesPlansAtTheIterationBoundary) {
  const Plan a{{DType::kFloat16, DType::kFloat32}, {100, 50}};
  const Plan b{{DType::kFloat32, DType::kFloat16, DType::kFloat16},
               {30, 80, 40}};
  auto backends =
      FakeCollectiveBackend::CreateGroup(2, absl::Seconds(10), {"a", "b"});
  std::vector<std::unique_ptr<HierarchicalReducer>> reducers;
  for (int k = 0; k < 2; ++k) {
    HierarchicalReducer::Options options;
    options.num_buckets = 2;
    options.node_offsets = {0, 1};
    options.world_size = 2;
    options.scheduling = GetParam();
    reducers.push_back(
        std::make_unique<HierarchicalReducer>(options, std::move(backends[k])));
  }
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back(
        [&, k] { errors[k] = RunNode(*reducers[k], k, a, b); });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

INSTANTIATE_TEST_SUITE_P(
    PlanAndPriorityOrder, HierarchicalReplanTest,
    ::testing::Values(HierarchicalReducer::Options::Scheduling::kPlanOrder,
                      HierarchicalReducer::Options::Scheduling::kPriority));

}  // namespace
}  // namespace gradd
