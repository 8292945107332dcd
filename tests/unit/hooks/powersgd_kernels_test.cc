// PowerSGD's kernels (server/hooks/powersgd_kernels.h): each sweep against
// a plain double-precision reference, and every instruction set the CPU
// has against the baseline one, to the bit (the nodes of a job must agree
// whatever their CPUs), on shapes that leave partial vectors, chunks, row
// blocks and padding.
#include "server/hooks/powersgd_kernels.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradd::powersgd {
namespace {

struct Shape {
  size_t rows, cols, rank;
  int ranks;
  bool keep, deferred;
  size_t padding;  // trailing elements without gradients
};

struct Outputs {
  std::vector<float> m, p, q;
  std::vector<std::vector<float>> result;
};

// Runs the three sweeps once with the kernels in use.
Outputs RunSweeps(const Shape& s, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  auto fill = [&](std::vector<float>& v) {
    for (float& x : v) x = dist(gen);
  };
  const size_t len = s.rows * s.cols;
  std::vector<std::vector<float>> grads(s.ranks, std::vector<float>(len));
  for (auto& g : grads) fill(g);
  std::vector<const float*> g;
  for (auto& v : grads) g.push_back(v.data());
  Outputs out;
  out.m.resize(len);
  fill(out.m);
  std::vector<float> qt(s.rank * s.cols), prev_p(s.rows * s.rank),
      prev_qt(s.rank * s.cols);
  fill(qt);
  fill(prev_p);
  fill(prev_qt);
  out.p.assign(s.rows * s.rank, -1.0f);
  Pass1Matrix a;
  a.m = out.m.data();
  a.g = g.data();
  a.n = s.ranks;
  a.valid = len - s.padding;
  a.rows = s.rows;
  a.cols = s.cols;
  a.rank = s.rank;
  a.keep = s.keep;
  if (s.deferred) {
    a.prev_p = prev_p.data();
    a.prev_qt = prev_qt.data();
    a.deferred_ranks = static_cast<float>(s.ranks);
  }
  a.qt = qt.data();
  a.p = out.p.data();
  for (size_t i = 0; i < s.rows; i += kRowBlock) {
    Pass1Rows(a, i, std::min(kRowBlock, s.rows - i));
  }
  out.q.assign(s.cols * s.rank, -1.0f);
  std::vector<float> acc;
  TransposedTimesP(out.m.data(), out.p.data(), out.q.data(), s.rows, s.cols,
                   s.rank, 0, s.cols, acc);
  out.result.assign(s.ranks, std::vector<float>(len, 7.0f));
  std::vector<float*> o;
  for (auto& v : out.result) o.push_back(v.data());
  for (size_t i = 0; i < s.rows; i += kRowBlock) {
    ResultRows(out.p.data(), qt.data(), s.cols, s.rank, i,
               std::min(kRowBlock, s.rows - i), o.data(), s.ranks,
               len - s.padding, /*stream=*/s.ranks == 2);
  }
  FenceStreamingStores();

  // The reference, in double from the same inputs.
  std::mt19937 again(seed);
  std::normal_distribution<float> d2;
  std::vector<std::vector<float>> g2(s.ranks, std::vector<float>(len));
  for (auto& v : g2) {
    for (float& x : v) x = d2(again);
  }
  std::vector<double> m(len);
  for (double& x : m) x = d2(again);
  std::vector<double> qt2(s.rank * s.cols), pp(s.rows * s.rank),
      pq(s.rank * s.cols);
  for (double& x : qt2) x = d2(again);
  for (double& x : pp) x = d2(again);
  for (double& x : pq) x = d2(again);
  for (size_t i = 0; i < s.rows; ++i) {
    for (size_t j = 0; j < s.cols; ++j) {
      const size_t e = i * s.cols + j;
      double v = s.keep ? m[e] : 0.0;
      if (s.deferred) {
        for (size_t k = 0; k < s.rank; ++k) {
          v -= s.ranks * pp[i * s.rank + k] * pq[k * s.cols + j];
        }
      }
      if (e < len - s.padding) {
        for (auto& gr : g2) v += gr[e];
      }
      m[e] = v;
      EXPECT_NEAR(out.m[e], v, 1e-4 * (1 + std::fabs(v))) << i << "," << j;
    }
    for (size_t k = 0; k < s.rank; ++k) {
      double p = 0;
      for (size_t j = 0; j < s.cols; ++j) {
        p += m[i * s.cols + j] * qt2[k * s.cols + j];
      }
      EXPECT_NEAR(out.p[i * s.rank + k], p, 1e-3 * (1 + std::fabs(p)));
    }
  }
  for (size_t j = 0; j < s.cols; ++j) {
    for (size_t k = 0; k < s.rank; ++k) {
      double q = 0;
      for (size_t i = 0; i < s.rows; ++i) {
        q += static_cast<double>(out.m[i * s.cols + j]) * out.p[i * s.rank + k];
      }
      EXPECT_NEAR(out.q[j * s.rank + k], q, 1e-3 * (1 + std::fabs(q)));
    }
  }
  for (size_t e = 0; e < len; ++e) {
    double v = 0;
    for (size_t k = 0; k < s.rank; ++k) {
      v += static_cast<double>(out.p[e / s.cols * s.rank + k]) *
           qt[k * s.cols + e % s.cols];
    }
    for (const auto& r : out.result) {
      if (e < len - s.padding) {
        EXPECT_NEAR(r[e], v, 1e-4 * (1 + std::fabs(v))) << e;
      } else {
        EXPECT_EQ(r[e], 7.0f) << "padding written at " << e;
      }
    }
  }
  return out;
}

const Shape kShapes[] = {
    {1, 1, 1, 1, true, false, 0},    {3, 17, 2, 2, true, true, 0},
    {5, 300, 3, 3, false, false, 0}, {9, 531, 5, 2, true, true, 40},
    {33, 256, 4, 1, true, true, 0},  {6, 1000, 9, 2, true, false, 700},
    {4, 16, 4, 2, false, false, 20}, {17, 4096, 4, 2, true, true, 0},
};

TEST(PowerSgdKernelsTest, SweepsMatchADoublePrecisionReference) {
  UseKernelsForTesting(-1);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s.rows << "x" << s.cols << " rank "
                                      << s.rank << " ranks " << s.ranks);
    RunSweeps(s, 7);
  }
}

TEST(PowerSgdKernelsTest, EveryInstructionSetGivesTheSameBits) {
  for (const Shape& s : kShapes) {
    ASSERT_EQ(UseKernelsForTesting(0), 0);
    const Outputs base = RunSweeps(s, 11);
    for (int isa : {1, 2}) {
      if (UseKernelsForTesting(isa) != isa) continue;  // CPU lacks it
      SCOPED_TRACE(::testing::Message() << "isa " << isa << ", " << s.rows
                                        << "x" << s.cols << " rank " << s.rank);
      const Outputs got = RunSweeps(s, 11);
      EXPECT_EQ(std::memcmp(got.m.data(), base.m.data(), base.m.size() * 4), 0);
      EXPECT_EQ(std::memcmp(got.p.data(), base.p.data(), base.p.size() * 4), 0);
      EXPECT_EQ(std::memcmp(got.q.data(), base.q.data(), base.q.size() * 4), 0);
      EXPECT_EQ(got.result, base.result);
    }
  }
  UseKernelsForTesting(-1);
}

}  // namespace
}  // namespace gradd::powersgd
