#include "server/hooks/powersgd_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GRADD_PSGD_X86 1
#include <immintrin.h>
#else
#define GRADD_PSGD_X86 0
#endif

namespace gradd::powersgd {
namespace {

#define GRADD_INLINE inline __attribute__((always_inline))

constexpr size_t kColumnBlock = 512;  // pass 2: columns per accumulator

struct KernelTable {
  void (*pass1_rows)(const Pass1Matrix&, size_t, size_t);
  void (*transposed_times_p)(const float*, const float*, float*, size_t, size_t,
                             size_t, size_t, size_t, std::vector<float>&);
  void (*result_rows)(const float*, const float*, size_t, size_t, size_t,
                      size_t, float* const*, int, size_t, bool);
  void (*sum_into)(float*, const float* const*, int, size_t, bool, size_t,
                   size_t);
  void (*subtract_result)(float*, const float*, size_t, float);
};

namespace baseline {
#define GRADD_PSGD_ISA 0
#include "server/hooks/powersgd_kernels.inc"
#undef GRADD_PSGD_ISA
}  // namespace baseline

#if GRADD_PSGD_X86
// The same kernels for AVX2 + FMA and for AVX-512, chosen at run time so
// the binaries still run on any x86-64 (no -march=native at build time).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
#define GRADD_PSGD_ISA 1
#include "server/hooks/powersgd_kernels.inc"
#undef GRADD_PSGD_ISA
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
namespace avx512 {
#define GRADD_PSGD_ISA 2
#include "server/hooks/powersgd_kernels.inc"
#undef GRADD_PSGD_ISA
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // GRADD_PSGD_X86

// The set `isa` names (0 baseline, 1 AVX2 + FMA, 2 AVX-512), or the best
// below it that the CPU has.
const KernelTable* Table(int isa) {
#if GRADD_PSGD_X86
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (isa >= 2 && fma && __builtin_cpu_supports("avx512f")) {
    return &avx512::kKernels;
  }
  if (isa >= 1 && fma && __builtin_cpu_supports("avx2")) {
    return &avx2::kKernels;
  }
#endif
  return &baseline::kKernels;
}

std::atomic<const KernelTable*> g_kernels{Table(2)};

}  // namespace

int UseKernelsForTesting(int isa) {
  const KernelTable* table = Table(isa < 0 ? 2 : isa);
  g_kernels.store(table, std::memory_order_relaxed);
#if GRADD_PSGD_X86
  if (table == &avx512::kKernels) return 2;
  if (table == &avx2::kKernels) return 1;
#endif
  return 0;
}

void Orthogonalize(float* x, size_t rows, size_t cols, float epsilon) {
  for (size_t i = 0; i < cols; ++i) {
    double sq = 0;
    for (size_t k = 0; k < rows; ++k) {
      const double v = x[k * cols + i];
      sq += v * v;
    }
    const float norm = static_cast<float>(std::sqrt(sq)) + epsilon;
    for (size_t k = 0; k < rows; ++k) x[k * cols + i] /= norm;
    for (size_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (size_t k = 0; k < rows; ++k) {
        dot += static_cast<double>(x[k * cols + i]) * x[k * cols + j];
      }
      const float d = static_cast<float>(dot);
      for (size_t k = 0; k < rows; ++k) x[k * cols + j] -= d * x[k * cols + i];
    }
  }
}

void Transpose(const float* x, size_t rows, size_t cols, float* out) {
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) out[j * rows + i] = x[i * cols + j];
  }
}

void SumInto(float* m, const float* const* g, int n, size_t valid, bool keep,
             size_t begin, size_t end) {
  g_kernels.load(std::memory_order_relaxed)
      ->sum_into(m, g, n, valid, keep, begin, end);
}

void Pass1Rows(const Pass1Matrix& a, size_t row, size_t count) {
  g_kernels.load(std::memory_order_relaxed)->pass1_rows(a, row, count);
}

void TransposedTimesP(const float* m, const float* p, float* q, size_t rows,
                      size_t cols, size_t rank, size_t begin, size_t end,
                      std::vector<float>& acc) {
  g_kernels.load(std::memory_order_relaxed)
      ->transposed_times_p(m, p, q, rows, cols, rank, begin, end, acc);
}

void ResultRows(const float* p, const float* qt, size_t cols, size_t rank,
                size_t row, size_t count, float* const* out, int n,
                size_t valid, bool stream) {
  g_kernels.load(std::memory_order_relaxed)
      ->result_rows(p, qt, cols, rank, row, count, out, n, valid, stream);
}

void WriteResult(const float* v, size_t at, size_t len, float* const* g, int n,
                 size_t valid, float* error) {
  const size_t real = std::min(len, valid > at ? valid - at : 0);
  for (int r = 0; r < n; ++r) std::copy(v, v + real, g[r] + at);
  if (error != nullptr) {
    g_kernels.load(std::memory_order_relaxed)
        ->subtract_result(error + at, v, len, static_cast<float>(n));
  }
}

void FenceStreamingStores() {
#if GRADD_PSGD_X86
  _mm_sfence();
#endif
}

}  // namespace gradd::powersgd
