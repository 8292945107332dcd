#include "common/thread_pool.h"

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

TEST(ThreadPoolTest, SizeDefaultsToHardware) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(),
            std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  ThreadPool three(3);
  EXPECT_EQ(three.size(), 3);
}

TEST(ThreadPoolTest, CoversRangeExactlyOnceWithAlignedChunks) {
  ThreadPool pool(4);
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{1000},
                   size_t{4096}, size_t{100003}}) {
    for (size_t min_chunk : {size_t{0}, size_t{1}, size_t{64}, size_t{300}}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex mu;
      std::vector<std::pair<size_t, size_t>> chunks;
      pool.ParallelFor(n, min_chunk, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
        std::lock_guard<std::mutex> l(mu);
        chunks.emplace_back(b, e);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
      ASSERT_LE(chunks.size(), 4u);
      for (auto [b, e] : chunks) {
        EXPECT_LT(b, e);
        EXPECT_EQ(b % 64, 0u) << "chunk starts are multiples of 64";
        if (chunks.size() > 1 && e != n) {
          EXPECT_GE(e - b, std::max<size_t>(min_chunk, 1));
        }
      }
    }
  }
}

TEST(ThreadPoolTest, SmallRangesRunInlineOnTheCaller) {
  ThreadPool pool(2);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  pool.ParallelFor(1000, 600, [&](size_t b, size_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(b, 0u);
    EXPECT_EQ(e, 1000u);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  pool.ParallelFor(0, 1, [&](size_t, size_t) { ++calls; });
  EXPECT_EQ(calls, 1) << "n == 0 runs nothing";
}

TEST(ThreadPoolTest, LargeRangesUseWorkers) {
  ThreadPool pool(2);
  // Each chunk waits until both chunks have started, which only succeeds
  // if a worker really runs the second one concurrently.
  std::atomic<int> started{0};
  std::set<std::thread::id> ids;
  std::mutex mu;
  pool.ParallelFor(1 << 20, 1024, [&](size_t, size_t) {
    started.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    std::lock_guard<std::mutex> l(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(started.load(), 2);
  EXPECT_EQ(ids.size(), 2u);
}

TEST(ThreadPoolTest, ConcurrentCallersAllComplete) {
  ThreadPool pool(2);
  constexpr int kCallers = 4;
  constexpr int kRounds = 300;
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        const size_t n = 1000 + 64 * ((c * 7 + r) % 50);
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(n, 128, [&](size_t b, size_t e) {
          int64_t s = 0;
          for (size_t i = b; i < e; ++i) s += static_cast<int64_t>(i);
          sum.fetch_add(s);
        });
        // Returns only after every chunk finished.
        ASSERT_EQ(sum.load(), static_cast<int64_t>(n) * (n - 1) / 2);
        total.fetch_add(1);
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), kCallers * kRounds);
}

TEST(ThreadPoolTest, SingleThreadPoolRunsEverythingInline) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  size_t covered = 0;
  pool.ParallelFor(1 << 20, 1, [&](size_t b, size_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    covered += e - b;
  });
  EXPECT_EQ(covered, size_t{1} << 20);
}

}  // namespace
}  // namespace gradd
