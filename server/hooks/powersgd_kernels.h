// The kernels of PowerSgdHook's compressed path (powersgd_hook.h): the
// three sweeps over the node's matrix M and the small dense helpers.
//
// Every sweep reads and writes its rows once, in column chunks small
// enough for L1 (kChunk): pass 1 forms M (error feedback, the deferred
// error update, the local gradients) and takes P = M Q from each chunk
// while it is in registers or L1; pass 2 sums Q = M^T P over rows; pass 3
// computes P Q^T chunk by chunk and stores it straight into every local
// rank's bucket.
//
// Arithmetic is float32, as torch's matmuls, with every multiply-add an
// explicit fused one (std::fma, correctly rounded) and every sum in a fixed
// order that depends neither on the vector width nor on how the rows or
// columns are split across threads, so the nodes of a job compute the same
// bits from the same inputs:
//   - P[r][k]: kLanes partial sums, element j into lane j % kLanes in
//     increasing j, then the lanes added in order;
//   - Q[j][k]: over rows in increasing order, four rows per nested fma;
//   - (P Q^T)[r][j]: over k in increasing order, four per nested fma.
// The kernels are compiled for baseline x86-64, AVX2 + FMA and AVX-512
// (powersgd_kernels.inc), the best the CPU has picked once at start; the
// set changes no result.
#ifndef GRADD_SERVER_HOOKS_POWERSGD_KERNELS_H_
#define GRADD_SERVER_HOOKS_POWERSGD_KERNELS_H_

#include <cstddef>
#include <vector>

namespace gradd::powersgd {

constexpr size_t kLanes = 16;    // partial sums per dot product
constexpr size_t kRowBlock = 4;  // rows of M per call of the row kernels
constexpr size_t kChunk = 256;   // columns per chunk of the row kernels

// Gram-Schmidt over the `cols` columns of a row-major rows x cols matrix,
// torch's _orthogonalize_gram_schmidt: each column divided by its norm
// (+ epsilon), then projected out of the later columns.
void Orthogonalize(float* x, size_t rows, size_t cols, float epsilon);

// x (rows x cols, row-major) transposed into out (cols x rows).
void Transpose(const float* x, size_t rows, size_t cols, float* out);

// m[i] = (keep ? m[i] : 0) + sum over ranks of g_r[i], i in [begin, end);
// the gradients end at `valid` (batched PowerSGD pads the bucket).
void SumInto(float* m, const float* const* g, int n, size_t valid, bool keep,
             size_t begin, size_t end);

// Pass 1 over rows [row, row + count) (count <= kRowBlock) of one matrix:
// for each element,
//   M = (keep ? M : 0) - deferred_ranks * (prev_p prev_qt)   (if prev_p)
//       + sum over ranks of the gradient                     (below valid)
// written back to m, and p (rank apart) = M Q for those rows. prev_p only
// with keep (the deferred error update is error feedback's).
struct Pass1Matrix {
  float* m = nullptr;               // the matrix's first element in M
  const float* const* g = nullptr;  // the ranks' buckets, at the same
  int n = 0;                        // element as m
  size_t valid = 0;  // elements of the matrix (row-major) with gradients
  size_t rows = 0;
  size_t cols = 0;
  size_t rank = 0;
  bool keep = false;               // error feedback: M starts from E
  const float* prev_p = nullptr;   // rows x rank, or null: no deferred
  const float* prev_qt = nullptr;  // rank x cols
  float deferred_ranks = 0;
  const float* qt = nullptr;  // Q^T, rank x cols
  float* p = nullptr;         // rows x rank
};
void Pass1Rows(const Pass1Matrix& a, size_t row, size_t count);

// Pass 2: q[j][k] = sum over rows i of m[i][j] p[i][k], j in [begin, end)
// (q is cols x rank, torch's layout); `acc` scratch.
void TransposedTimesP(const float* m, const float* p, float* q, size_t rows,
                      size_t cols, size_t rank, size_t begin, size_t end,
                      std::vector<float>& acc);

// Pass 3 over rows [row, row + count) (count <= kRowBlock): P Q^T into
// every rank's bucket (out[r] at the matrix's first element; elements of
// the matrix from `valid` on are padding, not written). `stream`:
// non-temporal stores (call FenceStreamingStores on the same thread
// before the buckets are published).
void ResultRows(const float* p, const float* qt, size_t cols, size_t rank,
                size_t row, size_t count, float* const* out, int n,
                size_t valid, bool stream);

// The result `v` (elements [at, at + len) of the padded bucket) into every
// local rank's bucket (elements below `valid`), and the node's error
// m = M - n * result (if `error`).
void WriteResult(const float* v, size_t at, size_t len, float* const* g, int n,
                 size_t valid, float* error);

// Switches the kernels to baseline (isa 0), AVX2 + FMA (1), AVX-512 (2) or
// the CPU's best (-1), as far as the CPU has it; returns the set now in
// use. For tests (not thread-safe against running kernels).
int UseKernelsForTesting(int isa);

// Orders the streaming stores of ResultRows before whatever publishes the
// buckets (the reducer's completion).
void FenceStreamingStores();

}  // namespace gradd::powersgd

#endif  // GRADD_SERVER_HOOKS_POWERSGD_KERNELS_H_
