#include "server/hooks/torch_random.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

// Golden values printed by torch 1.13 / numpy:
//   rng = numpy.random.RandomState(0); rng.randint(1_000_000_000) x 3
TEST(TorchRandomTest, NumpyRandIntMatchesRandomState) {
  NumpyRandomState rng(0);
  EXPECT_EQ(rng.RandInt(1000000000), 209652396);
  EXPECT_EQ(rng.RandInt(1000000000), 398764591);
  EXPECT_EQ(rng.RandInt(1000000000), 924231285);
  NumpyRandomState other(7);
  EXPECT_EQ(other.RandInt(1000000000), 327741615);
  EXPECT_EQ(other.RandInt(1000000000), 976413892);
}

//   torch.manual_seed(209652396); torch.randn(20)  (16-blocks, tail redone)
TEST(TorchRandomTest, RandnOfSixteenOrMoreMatchesTorch) {
  TorchCpuRandom gen;
  gen.ManualSeed(209652396);
  std::vector<float> v(20);
  gen.Randn(v.data(), v.size());
  EXPECT_NEAR(v[0], -0.6394617557525635, 1e-6);
  EXPECT_NEAR(v[1], -0.11337342113256454, 1e-6);
  EXPECT_NEAR(v[2], 1.2295761108398438, 1e-6);
  EXPECT_NEAR(v[17], -2.083076238632202, 1e-6);
  EXPECT_NEAR(v[18], -2.2713122367858887, 1e-6);
  EXPECT_NEAR(v[19], 0.4596719741821289, 1e-6);
  gen.ManualSeed(398764591);
  std::vector<float> w(80);  // randn(1, 40, 2)
  gen.Randn(w.data(), w.size());
  EXPECT_NEAR(w[0], 1.2061702013015747, 1e-6);
  EXPECT_NEAR(w[1], 0.41742759943008423, 1e-6);
  EXPECT_NEAR(w[2], 0.39462217688560486, 1e-6);
}

//   torch.manual_seed(398764591); torch.randn(5); torch.randn(3)
// (double Box-Muller whose cached second sample carries over calls)
TEST(TorchRandomTest, SmallRandnMatchesTorchAcrossCalls) {
  TorchCpuRandom gen;
  gen.ManualSeed(398764591);
  std::vector<float> a(5), b(3);
  gen.Randn(a.data(), a.size());
  gen.Randn(b.data(), b.size());
  const float want_a[] = {-1.180789589881897, 0.70230633020401,
                          -0.36986446380615234, 0.9415885210037231,
                          -0.16630391776561737};
  const float want_b[] = {-0.6060848832130432, -0.20116974413394928,
                          0.9103825688362122};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(a[i], want_a[i], 1e-6) << i;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(b[i], want_b[i], 1e-6) << i;
}

}  // namespace
}  // namespace gradd
