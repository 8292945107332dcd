#include "common/reduce.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradd {
namespace {

// ---- Independent references ----

// GCC's _Float16 conversion (libgcc/hardware) rounds to nearest even.
uint16_t RefFloatToHalf(float f) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(f));
}
float RefHalfToFloat(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}

// bfloat16 by picking the nearer of the two truncation neighbours in double
// arithmetic, ties to the even one; 0x7F80 stands for 2^128 when rounding up
// past the largest finite value.
uint16_t RefFloatToBFloat16(float f) {
  if (std::isnan(f)) return 0x7FC0;  // callers only check NaN-ness
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  if ((u & 0xFFFF) == 0) return lo;
  const uint16_t hi = lo + 1;
  auto value = [](uint16_t h) -> double {
    if ((h & 0x7FFF) == 0x7F80)
      return std::copysign(std::ldexp(1.0, 128), h & 0x8000 ? -1.0 : 1.0);
    return static_cast<double>(std::bit_cast<float>(uint32_t{h} << 16));
  };
  const double dlo = std::fabs(static_cast<double>(f) - value(lo));
  const double dhi = std::fabs(static_cast<double>(f) - value(hi));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
bool IsBFloat16Nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

TEST(ConversionTest, HalfToFloatAllValues) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = HalfToFloat(h);
    if (IsHalfNan(h)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(IsHalfNan(FloatToHalf(f))) << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(f),
              std::bit_cast<uint32_t>(RefHalfToFloat(h)))
        << "half 0x" << std::hex << h;
    // Every half (incl. subnormals, +-0, +-inf) round-trips exactly.
    ASSERT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(ConversionTest, FloatToHalfRoundsToNearestEven) {
  std::vector<float> values = {
      0.0f,
      -0.0f,
      1.0f,
      65504.0f,
      65519.99f,
      65520.0f,
      -65520.0f,
      1e9f,
      6.1035156e-05f /* 2^-14 */,
      5.9604645e-08f /* 2^-24 */,
      2.9802322e-08f /* 2^-25: tie to 0 */,
      4.4703484e-08f /* 1.5 * 2^-25 */,
      8.940697e-08f /* 1.5*2^-24 */,
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::denorm_min(),
      1.0009765625f /* 1+2^-10 */,
      1.00048828125f /* tie: 1 + 2^-11 -> even (1.0) */,
      1.00146484375f /* tie: 1 + 3*2^-11 -> 1 + 2^-9 */};
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(bits(rng));
    // Keep a good share in half's range, where rounding is interesting.
    if (i % 2)
      f = std::ldexp(
          std::bit_cast<float>((bits(rng) & 0x807FFFFF) | 0x3F800000),
          static_cast<int>(bits(rng) % 44) - 28);
    values.push_back(f);
  }
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(IsHalfNan(FloatToHalf(f)));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), RefFloatToHalf(f)) << f;
  }
}

TEST(ConversionTest, BFloat16RoundTripAndRounding) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = BFloat16ToFloat(h);
    if (IsBFloat16Nan(h)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(IsBFloat16Nan(FloatToBFloat16(f)));
      continue;
    }
    ASSERT_EQ(FloatToBFloat16(f), h);
  }
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> values = {std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               1.00390625f /* tie 1 + 2^-8 -> 1 */,
                               1.01171875f /* tie 1 + 3*2^-8 -> up */};
  for (int i = 0; i < 200000; ++i)
    values.push_back(std::bit_cast<float>(bits(rng)));
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(IsBFloat16Nan(FloatToBFloat16(f)));
      continue;
    }
    ASSERT_EQ(FloatToBFloat16(f), RefFloatToBFloat16(f)) << f;
  }
}

// ---- Typed buffers ----

// Every kernel test runs on the best kernel set of this CPU and on the
// baseline set, so both stay correct whichever machine runs the daemon.
class ReduceTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { ForceBaselineReduceKernelsForTesting(GetParam()); }
  void TearDown() override { ForceBaselineReduceKernelsForTesting(false); }
};

struct Case {
  DType dtype;
  int n;
  size_t len;
  size_t begin;
  size_t end;
  double divisor;
};

std::string Describe(const Case& c) {
  return std::string(DTypeName(c.dtype)) + " n=" + std::to_string(c.n) +
         " len=" + std::to_string(c.len) + " [" + std::to_string(c.begin) +
         "," + std::to_string(c.end) + ") / " + std::to_string(c.divisor);
}

// Element access in double / raw storage for any dtype.
double Get(DType t, const std::vector<uint8_t>& b, size_t i) {
  switch (t) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, b.data() + 4 * i, 4);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, b.data() + 8 * i, 8);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      return t == DType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h);
    }
  }
  return 0;
}

void Set(DType t, std::vector<uint8_t>& b, size_t i, double v) {
  switch (t) {
    case DType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(b.data() + 4 * i, &f, 4);
      break;
    }
    case DType::kFloat64:
      std::memcpy(b.data() + 8 * i, &v, 8);
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      float f = static_cast<float>(v);
      uint16_t h = t == DType::kFloat16 ? FloatToHalf(f) : FloatToBFloat16(f);
      std::memcpy(b.data() + 2 * i, &h, 2);
      break;
    }
  }
}

// The contract's numerics, emulated one element at a time: sum left to
// right in the accumulator type, divide, round once.
std::vector<uint8_t> ContractAverage(
    const Case& c, const std::vector<std::vector<uint8_t>>& in, size_t i) {
  std::vector<uint8_t> out(8);
  if (c.dtype == DType::kFloat64) {
    double s = Get(c.dtype, in[0], i);
    for (int k = 1; k < c.n; ++k) s += Get(c.dtype, in[k], i);
    s = s / c.divisor;
    std::memcpy(out.data(), &s, 8);
    return out;
  }
  float s = static_cast<float>(Get(c.dtype, in[0], i));
  for (int k = 1; k < c.n; ++k) s += static_cast<float>(Get(c.dtype, in[k], i));
  s = s / static_cast<float>(c.divisor);
  if (c.dtype == DType::kFloat32) {
    std::memcpy(out.data(), &s, 4);
  } else {
    uint16_t h =
        c.dtype == DType::kFloat16 ? FloatToHalf(s) : FloatToBFloat16(s);
    std::memcpy(out.data(), &h, 2);
  }
  return out;
}

std::vector<std::vector<uint8_t>> RandomInputs(const Case& c, uint32_t seed,
                                               bool small_integers) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  std::uniform_int_distribution<int> integer(-64, 64);
  std::vector<std::vector<uint8_t>> in(c.n);
  for (int k = 0; k < c.n; ++k) {
    in[k].resize(c.len * DTypeSize(c.dtype));
    for (size_t i = 0; i < c.len; ++i) {
      Set(c.dtype, in[k], i, small_integers ? integer(rng) : real(rng));
    }
  }
  return in;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType t :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (int n = 1; n <= 5; ++n) {
      for (size_t len :
           {size_t{1}, size_t{7}, size_t{64}, size_t{1000}, size_t{3001}}) {
        for (double divisor : {double(n), 3.0, 1.0, 0.5}) {
          cases.push_back({t, n, len, 0, len, divisor});
          if (len > 2) cases.push_back({t, n, len, 1, len - 1, divisor});
          if (len > 100) cases.push_back({t, n, len, 33, 77, divisor});
        }
      }
    }
  }
  return cases;
}

TEST_P(ReduceTest, FusedAverageMatchesContractAndFloat64Reference) {
  uint32_t seed = 0;
  for (const Case& c : AllCases()) {
    for (bool small_integers : {false, true}) {
      auto in = RandomInputs(c, ++seed, small_integers);
      auto bufs = in;
      std::vector<void*> ptrs;
      for (auto& b : bufs) ptrs.push_back(b.data());
      FusedAverage(c.dtype, ptrs.data(), c.n, c.begin, c.end, c.divisor);

      const size_t es = DTypeSize(c.dtype);
      // Machine epsilon of the output type, for the float64 comparison.
      const double eps = c.dtype == DType::kFloat64   ? 0x1p-52
                         : c.dtype == DType::kFloat32 ? 0x1p-23
                         : c.dtype == DType::kFloat16 ? 0x1p-10
                                                      : 0x1p-7;
      for (size_t i = 0; i < c.len; ++i) {
        for (int k = 0; k < c.n; ++k) {
          if (i < c.begin || i >= c.end) {
            ASSERT_EQ(
                std::memcmp(bufs[k].data() + i * es, in[k].data() + i * es, es),
                0)
                << "element outside the range changed: " << Describe(c);
            continue;
          }
          const auto want = ContractAverage(c, in, i);
          ASSERT_EQ(std::memcmp(bufs[k].data() + i * es, want.data(), es), 0)
              << Describe(c) << " element " << i << " buffer " << k << " got "
              << Get(c.dtype, bufs[k], i);
          // And close to the exact average computed in double.
          double ref = 0, mag = 0;
          for (int j = 0; j < c.n; ++j) {
            ref += Get(c.dtype, in[j], i);
            mag += std::fabs(Get(c.dtype, in[j], i));
          }
          ref /= c.divisor;
          mag /= c.divisor;
          const double got = Get(c.dtype, bufs[k], i);
          int exp2;
          const bool power_of_two = std::frexp(c.divisor, &exp2) == 0.5;
          if (small_integers && power_of_two) {
            // Sums of small integers are exact and the divisor is a power
            // of two: the closed form holds to the bit (up to output
            // rounding for bf16, whose 8 bits cannot hold every sum).
            if (c.dtype != DType::kBFloat16) {
              ASSERT_EQ(got, ref) << Describe(c) << " element " << i;
              continue;
            }
          }
          const double acc_eps = c.dtype == DType::kFloat64 ? 0x1p-52 : 0x1p-23;
          ASSERT_LE(std::fabs(got - ref),
                    (c.n + 1) * acc_eps * mag + eps * std::fabs(ref) + 1e-300)
              << Describe(c) << " element " << i;
        }
      }
    }
  }
}

TEST_P(ReduceTest, DivisionIsNotAReciprocalMultiply) {
  // For x = 1 * k, (x / 3) and x * (1/3.0f) differ for some k; the
  // contract promises the division.
  std::vector<float> a(256), b(256);
  int differs = 0;
  for (int i = 0; i < 256; ++i) {
    a[i] = static_cast<float>(i) * 0.37f + 1.0f;
    b[i] = 0.0f;
    if (a[i] / 3.0f != a[i] * (1.0f / 3.0f)) ++differs;
  }
  ASSERT_GT(differs, 0) << "test values do not discriminate";
  std::vector<float> want(256);
  for (int i = 0; i < 256; ++i) want[i] = (a[i] + b[i]) / 3.0f;
  void* ptrs[2] = {a.data(), b.data()};
  FusedAverage(DType::kFloat32, ptrs, 2, 0, 256, 3.0);
  for (int i = 0; i < 256; ++i) {
    ASSERT_EQ(a[i], want[i]) << i;
    ASSERT_EQ(b[i], want[i]) << i;
  }
}

TEST_P(ReduceTest, SixteenBitSpecialValuesThroughTheVectorPath) {
  // Every half / bfloat16 bit pattern through FusedAverage with n = 1 and
  // divisor 1: the vector and scalar conversions must give back the input
  // (NaN stays NaN), including subnormals and infinities.
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
    auto buf = all;
    void* p[1] = {buf.data()};
    FusedAverage(t, p, 1, 0, buf.size(), 1.0);
    for (uint32_t i = 0; i < 65536; ++i) {
      const bool nan =
          t == DType::kFloat16 ? IsHalfNan(all[i]) : IsBFloat16Nan(all[i]);
      if (nan) {
        ASSERT_TRUE(t == DType::kFloat16 ? IsHalfNan(buf[i])
                                         : IsBFloat16Nan(buf[i]))
            << i;
      } else {
        ASSERT_EQ(buf[i], all[i]) << DTypeName(t) << " " << i;
      }
    }
    // n = 2 (its own kernel): x + x over 2 is x again, exactly.
    auto a = all, b = all;
    void* q[2] = {a.data(), b.data()};
    FusedAverage(t, q, 2, 0, a.size(), 2.0);
    for (uint32_t i = 0; i < 65536; ++i) {
      const bool nan =
          t == DType::kFloat16 ? IsHalfNan(all[i]) : IsBFloat16Nan(all[i]);
      if (!nan) {
        // x + x overflows float only for the largest bfloat16 values.
        const float x = t == DType::kFloat16 ? HalfToFloat(all[i])
                                             : BFloat16ToFloat(all[i]);
        if (std::isfinite(x + x)) {
          ASSERT_EQ(a[i], all[i]) << i;
        }
        ASSERT_EQ(a[i], b[i]) << i;
      }
    }
  }
}

TEST_P(ReduceTest, SumAndScatterMatchContract) {
  uint32_t seed = 1000;
  for (DType t :
       {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const DType at = AccumulatorDType(t);
    for (int n = 1; n <= 5; ++n) {
      for (size_t len : {size_t{1}, size_t{9}, size_t{2500}}) {
        Case c{t, n, len, len > 2 ? size_t{1} : 0, len, 3.0};
        auto in = RandomInputs(c, ++seed, false);
        std::vector<const void*> srcs;
        for (auto& b : in) srcs.push_back(b.data());
        std::vector<uint8_t> acc(len * DTypeSize(at), 0xAB);
        SumToAccumulator(t, srcs.data(), n, acc.data(), c.begin, c.end);

        std::vector<std::vector<uint8_t>> outs(
            n, std::vector<uint8_t>(len * DTypeSize(t), 0xCD));
        std::vector<void*> out_ptrs;
        for (auto& o : outs) out_ptrs.push_back(o.data());
        ScatterFromAccumulator(t, acc.data(), c.divisor, out_ptrs.data(), n,
                               c.begin, c.end);

        for (size_t i = c.begin; i < c.end; ++i) {
          // Accumulator: left-to-right sum in the accumulator type.
          if (at == DType::kFloat64) {
            double s = Get(t, in[0], i);
            for (int k = 1; k < n; ++k) s += Get(t, in[k], i);
            ASSERT_EQ(Get(at, acc, i), s);
          } else {
            float s = static_cast<float>(Get(t, in[0], i));
            for (int k = 1; k < n; ++k)
              s += static_cast<float>(Get(t, in[k], i));
            ASSERT_EQ(static_cast<float>(Get(at, acc, i)), s);
          }
          // Scatter then equals the fused average bit for bit.
          const auto want = ContractAverage(c, in, i);
          for (int k = 0; k < n; ++k) {
            ASSERT_EQ(std::memcmp(outs[k].data() + i * DTypeSize(t),
                                  want.data(), DTypeSize(t)),
                      0)
                << DTypeName(t) << " n=" << n << " i=" << i;
          }
        }
        if (c.begin > 0) {
          EXPECT_EQ(acc[0], 0xAB) << "accumulator written outside range";
          EXPECT_EQ(outs[0][0], 0xCD) << "output written outside range";
        }
      }
    }
  }
}

TEST_P(ReduceTest, SumAndScatterInPlaceMatchTheSeparateAccumulator) {
  // float32/float64: the multi-node path sums into rank 0's buffer and
  // writes back from it. The result must equal the separate-accumulator
  // path bit for bit, and nothing outside [begin, end) may change.
  uint32_t seed = 2000;
  for (DType t : {DType::kFloat32, DType::kFloat64}) {
    for (int n = 1; n <= 4; ++n) {
      for (size_t len : {size_t{1}, size_t{9}, size_t{2500}}) {
        Case c{t, n, len, len > 2 ? size_t{1} : 0, len - (len > 2), 3.0};
        auto in = RandomInputs(c, ++seed, false);
        // Reference: separate accumulator.
        std::vector<const void*> srcs;
        for (auto& b : in) srcs.push_back(b.data());
        std::vector<uint8_t> acc(len * DTypeSize(t));
        SumToAccumulator(t, srcs.data(), n, acc.data(), c.begin, c.end);
        std::vector<std::vector<uint8_t>> want(
            n, std::vector<uint8_t>(len * DTypeSize(t)));
        std::vector<void*> want_ptrs;
        for (auto& o : want) want_ptrs.push_back(o.data());
        ScatterFromAccumulator(t, acc.data(), c.divisor, want_ptrs.data(), n,
                               c.begin, c.end);
        // In place.
        auto bufs = in;
        std::vector<void*> ptrs;
        for (auto& b : bufs) ptrs.push_back(b.data());
        SumToAccumulator(t, const_cast<const void* const*>(ptrs.data()), n,
                         ptrs[0], c.begin, c.end);
        for (size_t i = c.begin; i < c.end; ++i) {
          ASSERT_EQ(std::memcmp(bufs[0].data() + i * DTypeSize(t),
                                acc.data() + i * DTypeSize(t), DTypeSize(t)),
                    0)
              << DTypeName(t) << " n=" << n << " sum i=" << i;
        }
        ScatterFromAccumulator(t, ptrs[0], c.divisor, ptrs.data(), n, c.begin,
                               c.end);
        for (int k = 0; k < n; ++k) {
          for (size_t i = 0; i < len; ++i) {
            const bool inside = i >= c.begin && i < c.end;
            const uint8_t* expect = inside ? want[k].data() + i * DTypeSize(t)
                                           : in[k].data() + i * DTypeSize(t);
            ASSERT_EQ(std::memcmp(bufs[k].data() + i * DTypeSize(t), expect,
                                  DTypeSize(t)),
                      0)
                << DTypeName(t) << " n=" << n << " rank " << k << " i=" << i
                << (inside ? "" : " (outside the range)");
          }
        }
      }
    }
  }
}

TEST_P(ReduceTest, ReportsKernelSet) {
  if (GetParam()) {
    EXPECT_EQ(ReduceKernelIsa(), "baseline");
  } else {
    EXPECT_FALSE(ReduceKernelIsa().empty());
  }
}

TEST_P(ReduceTest, EmptyRangesAndZeroInputs) {
  std::vector<float> a = {1, 2, 3};
  void* p[1] = {a.data()};
  FusedAverage(DType::kFloat32, p, 1, 2, 2, 2.0);
  FusedAverage(DType::kFloat32, p, 0, 0, 3, 2.0);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  std::vector<float> acc = {5, 5, 5};
  SumToAccumulator(DType::kFloat32, nullptr, 0, acc.data(), 0, 3);
  EXPECT_EQ(acc, (std::vector<float>{0, 0, 0}));
}

// CompressAdd16 is the separate kernels' composition, bit for bit: sum in
// float32, divide, round to 16 bits, add the 16-bit partial sum in float32,
// round again -- on odd ranges, special values included.
TEST_P(ReduceTest, CompressAddIsTheSeparatePassesInOne) {
  constexpr size_t kLen = 3000;
  for (DType wire : {DType::kFloat16, DType::kBFloat16}) {
    for (int n : {1, 2, 3}) {
      for (double divisor : {4.0, 6.0}) {
        std::vector<std::vector<float>> src(n, std::vector<float>(kLen));
        std::vector<uint16_t> add(kLen);
        for (int k = 0; k < n; ++k) {
          for (size_t i = 0; i < kLen; ++i) {
            src[k][i] =
                static_cast<float>(std::sin(0.37 * i + k) * (1 << (i % 20)));
          }
        }
        src[0][5] = std::numeric_limits<float>::infinity();
        src[0][7] = std::numeric_limits<float>::quiet_NaN();
        for (size_t i = 0; i < kLen; ++i) {
          const float v = static_cast<float>(std::cos(0.11 * i) * 3.0);
          add[i] =
              wire == DType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
        }
        std::vector<const float*> fsrcs;
        std::vector<const void*> vsrcs;
        for (auto& v : src) {
          fsrcs.push_back(v.data());
          vsrcs.push_back(v.data());
        }
        const size_t begin = 3, end = kLen - 5;
        // The separate passes.
        std::vector<float> acc(kLen), sum2(kLen);
        std::vector<uint16_t> own(kLen), want(kLen), want_plain(kLen);
        SumToAccumulator(DType::kFloat32, vsrcs.data(), n, acc.data(), begin,
                         end);
        void* const own_out[1] = {own.data()};
        ScatterFromAccumulator(wire, acc.data(), divisor, own_out, 1, begin,
                               end);
        want_plain = own;
        const void* const both[2] = {own.data(), add.data()};
        SumToAccumulator(wire, both, 2, sum2.data(), begin, end);
        void* const want_out[1] = {want.data()};
        ScatterFromAccumulator(wire, sum2.data(), 1.0, want_out, 1, begin, end);
        // One pass.
        std::vector<uint16_t> got(kLen, 0xABCD), got_plain(kLen, 0xABCD);
        CompressAdd16(wire, fsrcs.data(), n, divisor, add.data(), got.data(),
                      begin, end);
        CompressAdd16(wire, fsrcs.data(), n, divisor, nullptr, got_plain.data(),
                      begin, end);
        for (size_t i = 0; i < kLen; ++i) {
          const bool inside = i >= begin && i < end;
          ASSERT_EQ(got[i], inside ? want[i] : 0xABCD)
              << DTypeName(wire) << " n=" << n << " / " << divisor << " at "
              << i;
          ASSERT_EQ(got_plain[i], inside ? want_plain[i] : 0xABCD)
              << DTypeName(wire) << " n=" << n << " / " << divisor << " at "
              << i;
        }
        // In place: `out` may be `add`.
        CompressAdd16(wire, fsrcs.data(), n, divisor, add.data(), add.data(),
                      begin, end);
        for (size_t i = begin; i < end; ++i) ASSERT_EQ(add[i], want[i]);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ReduceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Baseline" : "Best";
                         });

}  // namespace
}  // namespace gradd
