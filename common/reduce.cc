#include "common/reduce.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GRADD_X86 1
#else
#define GRADD_X86 0
#endif

#define GRADD_KERNEL_INLINE inline __attribute__((always_inline))

namespace gradd {
namespace {

// ---- Scalar 16-bit conversions (also the tails of the vector kernels). ----

inline float HalfToFloatImpl(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal half: mant * 2^-24 is exact in float.
    float f = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | sign);
  } else if (exp == 0x1F) {
    // Inf or NaN; the payload moves along so a NaN stays a NaN.
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t FloatToHalfImpl(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7FFFFFFFu;
  if (u > 0x7F800000u) {
    // NaN: quiet it and keep the top payload bits, as vcvtps2ph does.
    return sign | 0x7E00u | ((u >> 13) & 0x3FFu);
  }
  // 65520 is the midpoint between the largest half (65504) and 2^16; ties go
  // to even, which is infinity.
  if (u >= 0x477FF000u) return sign | 0x7C00u;
  if (u < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is a multiple of
    // 2^-24. Scaling by 2^24 is exact; nearbyint rounds to nearest even (the
    // default rounding mode). 1024 becomes the smallest normal, 0x0400.
    const float scaled = std::bit_cast<float>(u) * 0x1p24f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to
  // nearest even; a mantissa carry correctly bumps the exponent.
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xC8000FFFu + odd;
  return sign | static_cast<uint16_t>(u >> 13);
}

inline uint16_t FloatToBFloat16Impl(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// True when d is a power of two whose reciprocal is exactly representable
// as a normal number, so x * (*r) == x / d bit for bit for every x.
template <typename T>
bool ExactReciprocal(T d, T* r) {
  if (!std::isnormal(d) || d < 0) return false;
  int exp;
  if (std::frexp(d, &exp) != T(0.5)) return false;
  *r = T(1) / d;
  return std::isnormal(*r) && *r * d == T(1);
}

using FusedFn = void (*)(void* const*, int, size_t, size_t, double);
using SumFn = void (*)(const void* const*, int, void*, size_t, size_t);
using ScatterFn = void (*)(const void*, double, void* const*, int, size_t,
                           size_t);
using CompressAddFn = void (*)(const float* const*, int, double,
                               const uint16_t*, uint16_t*, size_t, size_t);

// Indexed by DType value - 1.
struct KernelTable {
  FusedFn fused[4];
  SumFn sum[4];
  ScatterFn scatter[4];
  CompressAddFn compress_add[2];  // float16, bfloat16
};

namespace baseline {
#define GRADD_KERNEL_F16C 0
#include "common/reduce_kernels.inc"
#undef GRADD_KERNEL_F16C
}  // namespace baseline

#if GRADD_X86
// The same kernels compiled for AVX2 + F16C, chosen at run time so the
// binaries still run on any x86-64 (no -march=native at build time).
// (clang, which builds the fuzz targets, spells the target pragma its own
// way.)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif
namespace avx2 {
#define GRADD_KERNEL_F16C 1
#include "common/reduce_kernels.inc"
#undef GRADD_KERNEL_F16C
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// F16C from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports
// does not know "f16c".
bool HasF16c() {
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

const KernelTable* BestKernels() {
#if GRADD_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && HasF16c()) {
    return &avx2::kKernels;
  }
#endif
  return &baseline::kKernels;
}

// Chosen once; tests may switch to the baseline set to cover both.
std::atomic<const KernelTable*> g_kernels{BestKernels()};

const KernelTable& Kernels() {
  return *g_kernels.load(std::memory_order_relaxed);
}

// Table slot of a dtype, or -1. Callers validate dtypes at the boundary
// (DTypeFromInt), so -1 is a programming error: it asserts in debug builds
// and does nothing in release ones, because the daemon must not crash.
int Index(DType dtype) {
  const int i = static_cast<int>(dtype) - 1;
  if (i < 0 || i >= 4) {
    assert(false && "invalid dtype passed to a reduction kernel");
    return -1;
  }
  return i;
}

}  // namespace

void FusedAverage(DType dtype, void* const* buffers, int n, size_t begin,
                  size_t end, double divisor) {
  if (int i = Index(dtype); i >= 0) {
    Kernels().fused[i](buffers, n, begin, end, divisor);
  }
}

void SumToAccumulator(DType dtype, const void* const* srcs, int n, void* acc,
                      size_t begin, size_t end) {
  if (int i = Index(dtype); i >= 0) Kernels().sum[i](srcs, n, acc, begin, end);
}

void ScatterFromAccumulator(DType dtype, const void* acc, double divisor,
                            void* const* outs, int n, size_t begin,
                            size_t end) {
  if (int i = Index(dtype); i >= 0) {
    Kernels().scatter[i](acc, divisor, outs, n, begin, end);
  }
}

void CompressAdd16(DType wire, const float* const* srcs, int n, double divisor,
                   const uint16_t* add, uint16_t* out, size_t begin,
                   size_t end) {
  if (wire == DType::kFloat16) {
    Kernels().compress_add[0](srcs, n, divisor, add, out, begin, end);
  } else if (wire == DType::kBFloat16) {
    Kernels().compress_add[1](srcs, n, divisor, add, out, begin, end);
  } else {
    assert(false && "CompressAdd16 takes a 16-bit wire type");
  }
}

std::string_view ReduceKernelIsa() {
#if GRADD_X86
  if (&Kernels() == &avx2::kKernels) return "avx2+f16c";
#endif
  return "baseline";
}

void ForceBaselineReduceKernelsForTesting(bool baseline) {
  g_kernels.store(baseline ? &baseline::kKernels : BestKernels(),
                  std::memory_order_relaxed);
}

float HalfToFloat(uint16_t h) { return HalfToFloatImpl(h); }
uint16_t FloatToHalf(float f) { return FloatToHalfImpl(f); }
float BFloat16ToFloat(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
uint16_t FloatToBFloat16(float f) { return FloatToBFloat16Impl(f); }

}  // namespace gradd
