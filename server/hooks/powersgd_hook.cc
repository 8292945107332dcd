#include "server/hooks/powersgd_hook.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/reduce.h"
#include "spdlog/spdlog.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace gradd {
namespace {

constexpr int64_t kSeedBound = 1000000000; // torch: rng.randint(1_000_000_000)

// Gram-Schmidt over the `cols` columns of a row-major rows x cols matrix,
// torch's _orthogonalize_gram_schmidt: each column divided by its norm
// (+ epsilon), then projected out of the later columns.
void Orthogonalize(float *x, size_t rows, size_t cols, float epsilon) {
  for (size_t i = 0; i < cols; ++i) {
    double sq = 0;
    for (size_t k = 0; k < rows; ++k) {
      const double v = x[k * cols + i];
      sq += v * v;
    }
    const float norm = static_cast<float>(std::sqrt(sq)) + epsilon;
    for (size_t k = 0; k < rows; ++k)
      x[k * cols + i] /= norm;
    for (size_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (size_t k = 0; k < rows; ++k) {
        dot += static_cast<double>(x[k * cols + i]) * x[k * cols + j];
      }
      const float d = static_cast<float>(dot);
      for (size_t k = 0; k < rows; ++k)
        x[k * cols + j] -= d * x[k * cols + i];
    }
  }
}

// Below this many multiply-adds a product runs on the calling thread.
constexpr size_t kMinParallelWork = 1 << 18;

// fn(begin, end) over [0, n) rows or columns of a product costing `work`
// multiply-adds, split across `pool` when that pays off.
void Split(ThreadPool *pool, size_t n, size_t work,
           absl::FunctionRef<void(size_t, size_t)> fn) {
  if (pool == nullptr || n < 2 || work < 2 * kMinParallelWork) {
    fn(0, n);
    return;
  }
  const size_t per = std::max<size_t>(1, kMinParallelWork / (work / n));
  pool->ParallelFor(n, per, fn);
}

// ---- The kernels of the compressed path. ----
//
// The bucket is read and written in three passes, each a single sweep over
// M (a bucket of float32 is far larger than the caches):
//   1. M = sum of the local gradients (+ the node's error, after last
//      iteration's deferred update), row by row, and P = M Q from each row
//      while it is still in L1;
//   2. Q = M^T P, over blocks of columns (the accumulators stay in L1);
//   3. the result P Q^T, row by row, straight into every local rank's
//      bucket.
// Arithmetic is float32, as torch's matmuls, with every multiply-add an
// explicit fused one (std::fma, correctly rounded) and every sum in a fixed
// order: kLanes partial sums per dot product, whatever the vector width,
// and no other contraction or reassociation. So the results are the same
// to the bit on every CPU and for every split across the pool -- the nodes
// of a job must compute the same result from the same P and Q. (These
// kernels were double precision, which converts every element twice;
// float32 with FMA does the same sweeps in a third of the time.)

// Each kernel is compiled for baseline x86-64 and for x86-64-v3 (AVX2 +
// FMA) and v4 (AVX-512), picked by the loader on the CPU that runs it
// (GCC's target_clones); the binaries still run on any x86-64. The vector
// widths change no result (see above); on CPUs older than x86-64-v3 (no
// FMA instruction) std::fma is libm's, correct but slow.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GRADD_CPU_CLONES                                                       \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define GRADD_CPU_CLONES
#endif

constexpr size_t kLanes = 16;        // partial sums per column of a dot
constexpr size_t kColumnBlock = 512; // pass 2: columns per accumulator
constexpr size_t kSumBlock = 2048;   // pass 1: elements per rank sweep

// m[i] = (error ? m[i] : 0) + sum over ranks of g_r[i], i in [begin, end);
// the gradients end at `valid` (batched PowerSGD pads the bucket with
// zeros).
GRADD_CPU_CLONES void SumInto(float *m, const float *const *g, int n,
                              size_t valid, bool error, size_t begin,
                              size_t end) {
  for (size_t b = begin; b < end; b += kSumBlock) {
    const size_t e = std::min(end, b + kSumBlock);
    const size_t ge = std::clamp(valid, b, e);
    if (!error)
      std::fill(m + b, m + e, 0.0f);
    for (int r = 0; r < n; ++r) {
      const float *gr = g[r];
      for (size_t i = b; i < ge; ++i)
        m[i] += gr[i];
    }
  }
}

constexpr size_t kRankBlock = 4; // columns of P / Q per sweep
// Rows of M per sweep of Q: each element of Q loaded from L2 once for
// this many rows (Q^T of a 4096-column matrix at rank 4 is 64 KiB, more
// than L1). Every row's sums are the same whatever the blocking.
constexpr size_t kRowBlock = 4;

// p[r][k] = sum over j of m[r][j] q[k][j], r < R, k < KN (m's rows `cols`
// apart, p's rows `rank` apart): R x KN x kLanes independent
// partial sums (element j goes to lane j % kLanes), so the sweep is not
// bound by the latency of one chain of additions; the lanes are then
// added in order.
template <size_t R, size_t KN>
inline __attribute__((always_inline)) void
DotRows(const float *m, const float *qt, size_t cols, float *p, size_t rank) {
  float lanes[R][KN][kLanes] = {};
  const size_t whole = cols / kLanes * kLanes;
  for (size_t j = 0; j < whole; j += kLanes) {
    for (size_t r = 0; r < R; ++r) {
      const float *row = m + r * cols + j;
      for (size_t k = 0; k < KN; ++k) {
        const float *q = qt + k * cols + j;
        for (size_t l = 0; l < kLanes; ++l) {
          lanes[r][k][l] = std::fma(row[l], q[l], lanes[r][k][l]);
        }
      }
    }
  }
  for (size_t j = whole; j < cols; ++j) {
    for (size_t r = 0; r < R; ++r) {
      for (size_t k = 0; k < KN; ++k) {
        lanes[r][k][j - whole] =
            std::fma(m[r * cols + j], qt[k * cols + j], lanes[r][k][j - whole]);
      }
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t k = 0; k < KN; ++k) {
      float s = 0;
      for (size_t l = 0; l < kLanes; ++l)
        s += lanes[r][k][l];
      p[r * rank + k] = s;
    }
  }
}

// p[r][k] = sum over j of m[r][j] qt[k][j], r < R, k < rank: R
// consecutive rows of a row-major matrix and their rows of P.
template <size_t R>
inline __attribute__((always_inline)) void
RowsTimesQ(const float *m, const float *qt, size_t cols, size_t rank,
           float *p) {
  size_t k = 0;
  for (; k + kRankBlock <= rank; k += kRankBlock) {
    DotRows<R, kRankBlock>(m, qt + k * cols, cols, p + k, rank);
  }
  for (; k < rank; ++k)
    DotRows<R, 1>(m, qt + k * cols, cols, p + k, rank);
}

// out[r][j] = sum over k of p[r][k] qt[k][j], r < R, j < cols (out
// row-major), the terms added in order of k; four columns of Q per
// sweep, over blocks of columns whose sums stay in L1.
template <size_t R>
inline __attribute__((always_inline)) void
RowsApproximation(const float *p, const float *qt, size_t cols, size_t rank,
                  float *out) {
  constexpr size_t kBlock = 128;
  float acc[R][kBlock];
  for (size_t b = 0; b < cols; b += kBlock) {
    const size_t w = std::min(kBlock, cols - b);
    for (size_t r = 0; r < R; ++r)
      std::fill(acc[r], acc[r] + w, 0.0f);
    size_t k = 0;
    for (; k + 4 <= rank; k += 4) {
      float pr[R][4];
      for (size_t r = 0; r < R; ++r) {
        for (size_t t = 0; t < 4; ++t)
          pr[r][t] = p[r * rank + k + t];
      }
      const float *q0 = qt + k * cols + b;
      const float *q1 = q0 + cols;
      const float *q2 = q1 + cols;
      const float *q3 = q2 + cols;
      for (size_t j = 0; j < w; ++j) {
        const float x0 = q0[j], x1 = q1[j], x2 = q2[j], x3 = q3[j];
        for (size_t r = 0; r < R; ++r) {
          acc[r][j] =
              std::fma(pr[r][3], x3,
                       std::fma(pr[r][2], x2,
                                std::fma(pr[r][1], x1,
                                         std::fma(pr[r][0], x0, acc[r][j]))));
        }
      }
    }
    for (; k < rank; ++k) {
      const float *qk = qt + k * cols + b;
      for (size_t r = 0; r < R; ++r) {
        const float pk = p[r * rank + k];
        for (size_t j = 0; j < w; ++j)
          acc[r][j] = std::fma(pk, qk[j], acc[r][j]);
      }
    }
    for (size_t r = 0; r < R; ++r) {
      std::copy(acc[r], acc[r] + w, out + r * cols + b);
    }
  }
}

// The kernels for `rows` (1 to kRowBlock) consecutive rows at once, one
// clone set each.
GRADD_CPU_CLONES void BlockTimesQ(const float *m, size_t rows, const float *qt,
                                  size_t cols, size_t rank, float *p) {
  switch (rows) {
  case 4:
    return RowsTimesQ<4>(m, qt, cols, rank, p);
  case 3:
    return RowsTimesQ<3>(m, qt, cols, rank, p);
  case 2:
    return RowsTimesQ<2>(m, qt, cols, rank, p);
  default:
    return RowsTimesQ<1>(m, qt, cols, rank, p);
  }
}

GRADD_CPU_CLONES void BlockApproximation(const float *p, size_t rows,
                                         const float *qt, size_t cols,
                                         size_t rank, float *out) {
  switch (rows) {
  case 4:
    return RowsApproximation<4>(p, qt, cols, rank, out);
  case 3:
    return RowsApproximation<3>(p, qt, cols, rank, out);
  case 2:
    return RowsApproximation<2>(p, qt, cols, rank, out);
  default:
    return RowsApproximation<1>(p, qt, cols, rank, out);
  }
}

// acc[k][j] += sum over rows i of m[i][b + j] p[i][k0 + k], k < KN, j < w,
// added in row order; four rows per load and store of an accumulator.
template <size_t KN>
inline __attribute__((always_inline)) void
AccumulateColumns(const float *__restrict m, const float *__restrict p,
                  size_t rows, size_t cols, size_t rank, size_t k0, size_t b,
                  size_t w, float *__restrict acc) {
  size_t i = 0;
  for (; i + 4 <= rows; i += 4) {
    const float *r0 = m + i * cols + b;
    const float *r1 = r0 + cols;
    const float *r2 = r1 + cols;
    const float *r3 = r2 + cols;
    float pk[4][KN];
    for (size_t t = 0; t < 4; ++t) {
      for (size_t k = 0; k < KN; ++k)
        pk[t][k] = p[(i + t) * rank + k0 + k];
    }
    for (size_t j = 0; j < w; ++j) {
      const float x0 = r0[j], x1 = r1[j], x2 = r2[j], x3 = r3[j];
      for (size_t k = 0; k < KN; ++k) {
        float *a = acc + k * w + j;
        *a = std::fma(
            x3, pk[3][k],
            std::fma(x2, pk[2][k],
                     std::fma(x1, pk[1][k], std::fma(x0, pk[0][k], *a))));
      }
    }
  }
  for (; i < rows; ++i) {
    const float *row = m + i * cols + b;
    for (size_t k = 0; k < KN; ++k) {
      const float pk = p[i * rank + k0 + k];
      float *a = acc + k * w;
      for (size_t j = 0; j < w; ++j)
        a[j] = std::fma(row[j], pk, a[j]);
    }
  }
}

// q[j][k] = sum over rows i of m[i][j] p[i][k], for j in [begin, end):
// q is cols x rank (torch's layout), `acc` scratch.
GRADD_CPU_CLONES void TransposedTimesP(const float *m, const float *p, float *q,
                                       size_t rows, size_t cols, size_t rank,
                                       size_t begin, size_t end,
                                       std::vector<float> &acc) {
  for (size_t b = begin; b < end; b += kColumnBlock) {
    const size_t e = std::min(end, b + kColumnBlock);
    const size_t w = e - b;
    acc.assign(rank * w, 0.0f);
    size_t k = 0;
    for (; k + kRankBlock <= rank; k += kRankBlock) {
      AccumulateColumns<kRankBlock>(m, p, rows, cols, rank, k, b, w,
                                    acc.data() + k * w);
    }
    for (; k < rank; ++k) {
      AccumulateColumns<1>(m, p, rows, cols, rank, k, b, w, acc.data() + k * w);
    }
    for (size_t k2 = 0; k2 < rank; ++k2) {
      for (size_t j = 0; j < w; ++j)
        q[(b + j) * rank + k2] = acc[k2 * w + j];
    }
  }
}

// m[j] -= nf * v[j], j < len: a result taken out of M, which leaves the
// node's error (WriteResult's update, or the one pass 3 defers to the next
// pass 1).
GRADD_CPU_CLONES void SubtractResult(float *m, const float *v, size_t len,
                                     float nf) {
  for (size_t j = 0; j < len; ++j)
    m[j] = std::fma(-nf, v[j], m[j]);
}

// The result `v` (elements [at, at + len) of the padded bucket) into every
// local rank's bucket (elements below `valid`), and the node's error
// m = M - n * result.
GRADD_CPU_CLONES void WriteResult(const float *v, size_t at, size_t len,
                                  float *const *g, int n, size_t valid,
                                  float *error, bool stream) {
  const size_t real = std::min(len, valid > at ? valid - at : 0);
  for (int r = 0; r < n; ++r) {
    float *out = g[r] + at;
    size_t j = 0;
#if defined(__SSE2__)
    if (stream) {
      // Non-temporal stores: the ranks' buckets are not read again by
      // this thread, and a bucket this large would only evict the cache;
      // streaming also skips reading each line before it is written.
      for (; j < real && reinterpret_cast<uintptr_t>(out + j) % 16 != 0; ++j) {
        out[j] = v[j];
      }
      for (; j + 4 <= real; j += 4)
        _mm_stream_ps(out + j, _mm_loadu_ps(v + j));
    }
#endif
    for (; j < real; ++j)
      out[j] = v[j];
  }
  if (error != nullptr) {
    SubtractResult(error + at, v, len, static_cast<float>(n));
  }
}

// Orders the streaming stores of WriteResult before whatever publishes the
// buckets (the reducer's completion).
void FenceStreamingStores() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Buckets from this size on are written with streaming stores.
constexpr size_t kStreamMinBytes = size_t{4} << 20;

// x (rows x cols, row-major) transposed into out (cols x rows).
void Transpose(const float *x, size_t rows, size_t cols, float *out) {
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j)
      out[j * rows + i] = x[i * cols + j];
  }
}

} // namespace

std::vector<PowerSgdHook::Layout>
PowerSgdHook::PerParameterLayouts(const std::vector<ParamInfo> &params,
                                  const BucketPlan &plan, int rank,
                                  double min_compression_rate) {
  std::vector<Layout> layouts;
  for (const Bucket &bucket : plan.buckets) {
    Layout layout;
    const size_t elem = DTypeSize(bucket.dtype);
    layout.count = bucket.size_bytes / elem;
    layout.padded = layout.count;
    // torch groups the matrices to compress by shape, in the order each
    // shape first appears, and lays out P and Q in that order.
    std::vector<std::pair<size_t, size_t>> shapes; // (rows, cols)
    std::vector<std::vector<Matrix>> groups;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const ParamInfo &param = params[bucket.params[k]];
      const size_t offset = bucket.param_offsets[k] / elem;
      const size_t numel = param.numel();
      const size_t rows = param.shape.empty() ? 1 : param.shape[0];
      const size_t cols = rows == 0 ? 0 : numel / rows;
      const size_t r = std::min({rows, cols, static_cast<size_t>(rank)});
      // torch's _should_compress.
      const bool compress =
          numel > 0 &&
          static_cast<double>((rows + cols) * r) * min_compression_rate <
              static_cast<double>(rows * cols);
      if (!compress) {
        layout.uncompressed.emplace_back(offset, numel);
        continue;
      }
      const std::pair<size_t, size_t> shape(rows, cols);
      auto it = std::find(shapes.begin(), shapes.end(), shape);
      size_t g = it - shapes.begin();
      if (it == shapes.end()) {
        shapes.push_back(shape);
        groups.emplace_back();
      }
      Matrix m;
      m.offset = offset;
      m.rows = rows;
      m.cols = cols;
      m.rank = r;
      groups[g].push_back(m);
    }
    for (std::vector<Matrix> &group : groups) {
      for (Matrix &m : group) {
        m.p_offset = layout.p_size;
        m.q_offset = layout.q_size;
        layout.p_size += m.rows * m.rank;
        layout.q_size += m.cols * m.rank;
        layout.matrices.push_back(m);
      }
    }
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

std::vector<PowerSgdHook::Layout>
PowerSgdHook::BatchedLayouts(const BucketPlan &plan, int rank) {
  std::vector<Layout> layouts;
  for (const Bucket &bucket : plan.buckets) {
    Layout layout;
    layout.count = bucket.size_bytes / DTypeSize(bucket.dtype);
    const size_t side = static_cast<size_t>(
        std::ceil(std::sqrt(static_cast<double>(layout.count))));
    layout.padded = side * side;
    Matrix m;
    m.rows = side;
    m.cols = side;
    m.rank = std::min(side, static_cast<size_t>(rank));
    layout.p_size = side * m.rank;
    layout.q_size = side * m.rank;
    layout.matrices.push_back(m);
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

absl::StatusOr<std::unique_ptr<CommHookInterface>>
MakePowerSgdHook(const v1::CommHookSpec &spec, const CommHookContext &context) {
  const v1::CommHookSpec n = NormalizeCommHookSpec(spec);
  // The model's buckets only: gradd's own (Bucket::internal, planned after
  // every model bucket) never go through the hook, and torch's random draws
  // are numbered over the model's buckets.
  BucketPlan model_plan;
  for (const Bucket &b : context.plan->buckets) {
    if (!b.internal)
      model_plan.buckets.push_back(b);
  }
  model_plan.total_bytes = context.plan->total_bytes;
  for (size_t b = 0; b < model_plan.buckets.size(); ++b) {
    const DType dtype = model_plan.buckets[b].dtype;
    if (dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "communication hook '", n.name(), "' runs on float32 gradients; ",
          "bucket ", b, " holds ", std::string(DTypeName(dtype))));
    }
  }
  const bool batched = n.name() == "batched_powerSGD";
  std::vector<PowerSgdHook::Layout> layouts =
      batched ? PowerSgdHook::BatchedLayouts(model_plan,
                                             n.matrix_approximation_rank())
              : PowerSgdHook::PerParameterLayouts(*context.params, model_plan,
                                                  n.matrix_approximation_rank(),
                                                  n.min_compression_rate());
  return std::make_unique<PowerSgdHook>(n, context.world_size,
                                        std::move(layouts), context.pool);
}

PowerSgdHook::PowerSgdHook(const v1::CommHookSpec &spec, int world_size,
                           std::vector<Layout> layouts, ThreadPool *pool)
    : batched_(spec.name() == "batched_powerSGD"),
      start_iter_(spec.start_powersgd_iter()),
      error_feedback_(spec.use_error_feedback()),
      warm_start_(spec.warm_start()),
      // batched_powerSGD_hook orthogonalises without the state's epsilon.
      epsilon_(batched_ ? 0.0f
                        : static_cast<float>(spec.orthogonalization_epsilon())),
      world_size_(world_size), layouts_(std::move(layouts)),
      states_(layouts_.size()), pool_(pool),
      rng_(static_cast<uint32_t>(spec.random_seed())) {}

double PowerSgdHook::PhaseTimes::total_s() const {
  return vanilla_s + uncompressed_s + q_s + pass1_s + allreduce_p_s +
         orthogonalize_p_s + pass2_s + allreduce_q_s + pass3_s + first_runs_s;
}

PowerSgdHook::PhaseTimes &
PowerSgdHook::PhaseTimes::operator+=(const PhaseTimes &t) {
  runs += t.runs;
  vanilla_runs += t.vanilla_runs;
  first_runs += t.first_runs;
  vanilla_s += t.vanilla_s;
  uncompressed_s += t.uncompressed_s;
  q_s += t.q_s;
  pass1_s += t.pass1_s;
  allreduce_p_s += t.allreduce_p_s;
  orthogonalize_p_s += t.orthogonalize_p_s;
  pass2_s += t.pass2_s;
  allreduce_q_s += t.allreduce_q_s;
  pass3_s += t.pass3_s;
  first_runs_s += t.first_runs_s;
  return *this;
}

PowerSgdHook::~PowerSgdHook() {
  if (times_.runs + times_.first_runs + times_.vanilla_runs > 0) {
    spdlog::info("{}", DescribePhaseTimes());
  }
}

std::string PowerSgdHook::DescribePhaseTimes() const {
  size_t elements = 0;
  for (const Layout &l : layouts_)
    elements += l.count;
  const double runs = std::max<double>(1, times_.runs);
  auto ms = [&](double s) { return absl::StrFormat("%.3f", s * 1e3 / runs); };
  return absl::StrCat(
      name(), " hook over ", elements, " bucket elements: ", times_.runs,
      " compressed runs, ms per run: uncompressed=", ms(times_.uncompressed_s),
      " q=", ms(times_.q_s), " pass1=", ms(times_.pass1_s),
      " allreduce_p=", ms(times_.allreduce_p_s),
      " orthogonalize_p=", ms(times_.orthogonalize_p_s),
      " pass2=", ms(times_.pass2_s), " allreduce_q=", ms(times_.allreduce_q_s),
      " pass3=", ms(times_.pass3_s), " (", times_.first_runs,
      " first compressed runs, ",
      absl::StrFormat("%.3f", times_.first_runs_s * 1e3 /
                                  std::max<double>(1, times_.first_runs)),
      " ms per run; ", times_.vanilla_runs, " vanilla runs, ",
      absl::StrFormat("%.3f", times_.vanilla_s * 1e3 /
                                  std::max<double>(1, times_.vanilla_runs)),
      " ms per run)");
}

int64_t PowerSgdHook::Seed(uint64_t index) {
  while (next_draw_ <= index)
    drawn_[next_draw_++] = rng_.RandInt(kSeedBound);
  auto it = drawn_.find(index);
  const int64_t seed = it->second;
  drawn_.erase(it);
  return seed;
}

absl::Status PowerSgdHook::Vanilla(const CommHookWork &work,
                                   CollectiveBackendInterface &net) {
  const std::vector<void *> &buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  m_sum_.resize(work.count);
  SumToAccumulator(DType::kFloat32, buffers.data(), n, m_sum_.data(), 0,
                   work.count);
  if (absl::Status s =
          net.AllreduceSum(m_sum_.data(), work.count, DType::kFloat32);
      !s.ok()) {
    return s;
  }
  ScatterFromAccumulator(DType::kFloat32, m_sum_.data(), world_size_,
                         buffers.data(), n, 0, work.count);
  return absl::OkStatus();
}

absl::Status PowerSgdHook::Run(const CommHookWork &work,
                               CollectiveBackendInterface &net) {
  if (work.bucket < 0 || work.bucket >= static_cast<int>(layouts_.size()) ||
      work.dtype != DType::kFloat32 ||
      work.count != layouts_[work.bucket].count) {
    return absl::InternalError(absl::StrCat(name(), ": bucket ", work.bucket,
                                            " does not match the job's plan"));
  }
  // torch's state.iter is the number of finished iterations.
  PhaseTimes t; // this run's
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  // Adds the time since the last lap to `phase`.
  auto lap = [&last](double &phase) {
    const Clock::time_point now = Clock::now();
    phase += std::chrono::duration<double>(now - last).count();
    last = now;
  };
  if (static_cast<int64_t>(work.iteration) - 1 < start_iter_) {
    absl::Status s = Vanilla(work, net);
    lap(t.vanilla_s);
    t.vanilla_runs = 1;
    times_ += t;
    return s;
  }
  const Layout &layout = layouts_[work.bucket];
  BucketState &st = states_[work.bucket];
  const std::vector<void *> &buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  const size_t count = layout.count;
  const size_t len = layout.padded;
  std::vector<float *> grads(n);
  for (int r = 0; r < n; ++r)
    grads[r] = static_cast<float *>(buffers[r]);

  // M = the node's sum of the local ranks' M_r = grad_r + e_r. Only the
  // sum matters: P = M Q and Q = M^T P are linear in M, and the result is
  // the same for every rank, so the node keeps E = sum of its ranks'
  // errors (= M - n * result) instead of one error per rank -- the same
  // values, a third of the memory traffic. With error feedback M is kept
  // in E's memory; without it in scratch.
  //
  // The error of the compressed matrices is updated one iteration late:
  // pass 3 leaves this iteration's M in E's memory and keeps P and Q^T, and
  // the next pass 1 subtracts n * P Q^T row by row -- the same operations
  // on the same values as subtracting it in pass 3, so the same E to the
  // bit, but pass 3 then only writes the ranks' buckets (it reads no M and
  // writes no E: a fifth of the bytes the hook moves, on a 2-rank node).
  float *m;
  if (error_feedback_) {
    if (st.error.size() != len) {
      st.error.assign(len, 0.0f);
      st.deferred = false;
    }
    m = st.error.data();
  } else {
    m_sum_.resize(len);
    m = m_sum_.data();
  }
  float *const error = error_feedback_ ? m : nullptr;
  auto sum_range = [&](size_t b, size_t e) {
    SumInto(m, grads.data(), n, count, error_feedback_, b, e);
  };

  // Uncompressed tensors: averaged as they are.
  size_t packed_size = 0;
  for (const auto &[offset, numel] : layout.uncompressed)
    packed_size += numel;
  if (!batched_ && packed_size > 0) {
    packed_.resize(packed_size);
    size_t at = 0;
    for (const auto &[offset, numel] : layout.uncompressed) {
      // (A copy of the binding: clang 14 cannot capture structured
      // bindings.)
      Split(pool_, numel, numel, [&, offset = offset](size_t b, size_t e) {
        sum_range(offset + b, offset + e);
      });
      std::copy(m + offset, m + offset + numel, packed_.begin() + at);
      at += numel;
    }
    if (absl::Status s =
            net.AllreduceSum(packed_.data(), packed_size, DType::kFloat32);
        !s.ok()) {
      return s;
    }
    const float world = static_cast<float>(world_size_);
    for (float &v : packed_)
      v /= world;
    at = 0;
    for (const auto &[offset, numel] : layout.uncompressed) {
      WriteResult(packed_.data() + at, offset, numel, grads.data(), n, count,
                  error, /*stream=*/false);
      at += numel;
    }
  }
  lap(t.uncompressed_s);

  // Q: torch's draw, or last iteration's (warm start); orthogonalised.
  const bool randomize = !warm_start_ || !st.has_memory;
  if (randomize) {
    st.p.assign(layout.p_size, 0.0f);
    st.q.assign(layout.q_size, 0.0f);
    const uint64_t round =
        warm_start_ ? 0
                    : static_cast<uint64_t>(work.iteration - 1 - start_iter_);
    torch_rng_.ManualSeed(
        static_cast<uint64_t>(Seed(round * layouts_.size() + work.bucket)));
    for (const Matrix &mat : layout.matrices) {
      torch_rng_.Randn(st.q.data() + mat.q_offset, mat.cols * mat.rank);
    }
  }
  qt_.resize(layout.q_size);
  for (const Matrix &mat : layout.matrices) {
    Orthogonalize(st.q.data() + mat.q_offset, mat.cols, mat.rank, epsilon_);
    Transpose(st.q.data() + mat.q_offset, mat.cols, mat.rank,
              qt_.data() + mat.q_offset);
  }
  lap(t.q_s);
  // Pass 1: M row by row (after last iteration's deferred error update),
  // and P = M Q (summed over every rank below).
  const bool deferred = st.deferred;
  st.deferred = false; // from here on E's memory holds the new M
  const float prev_n = static_cast<float>(st.deferred_ranks);
  for (const Matrix &mat : layout.matrices) {
    const size_t terms = (deferred ? 2 * mat.rank : mat.rank) + n;
    Split(
        pool_, mat.rows, mat.rows * mat.cols * terms, [&](size_t b, size_t e) {
          std::vector<float> rows(deferred ? kRowBlock * mat.cols : 0);
          for (size_t i = b; i < e; i += kRowBlock) {
            const size_t r = std::min(kRowBlock, e - i);
            const size_t at = mat.offset + i * mat.cols;
            if (deferred) {
              BlockApproximation(st.prev_p.data() + mat.p_offset + i * mat.rank,
                                 r, st.prev_qt.data() + mat.q_offset, mat.cols,
                                 mat.rank, rows.data());
              SubtractResult(m + at, rows.data(), r * mat.cols, prev_n);
            }
            sum_range(at, at + r * mat.cols);
            BlockTimesQ(m + at, r, qt_.data() + mat.q_offset, mat.cols,
                        mat.rank, st.p.data() + mat.p_offset + i * mat.rank);
          }
        });
  }
  lap(t.pass1_s);
  if (absl::Status s =
          net.AllreduceSum(st.p.data(), layout.p_size, DType::kFloat32);
      !s.ok()) {
    return s;
  }
  lap(t.allreduce_p_s);
  for (const Matrix &mat : layout.matrices) {
    Orthogonalize(st.p.data() + mat.p_offset, mat.rows, mat.rank, epsilon_);
  }
  lap(t.orthogonalize_p_s);
  // Pass 2: Q = M^T P, summed over every rank, divided by the world size.
  for (const Matrix &mat : layout.matrices) {
    Split(pool_, mat.cols, mat.rows * mat.cols * mat.rank,
          [&](size_t b, size_t e) {
            std::vector<float> acc;
            TransposedTimesP(m + mat.offset, st.p.data() + mat.p_offset,
                             st.q.data() + mat.q_offset, mat.rows, mat.cols,
                             mat.rank, b, e, acc);
          });
  }
  lap(t.pass2_s);
  if (absl::Status s =
          net.AllreduceSum(st.q.data(), layout.q_size, DType::kFloat32);
      !s.ok()) {
    return s;
  }
  lap(t.allreduce_q_s);
  const float world = static_cast<float>(world_size_);
  for (float &v : st.q)
    v /= world;
  // Pass 3: the result P Q^T into every local rank's bucket, and the error.
  const bool stream = count * sizeof(float) >= kStreamMinBytes;
  for (const Matrix &mat : layout.matrices) {
    Transpose(st.q.data() + mat.q_offset, mat.cols, mat.rank,
              qt_.data() + mat.q_offset);
    Split(pool_, mat.rows, mat.rows * mat.cols * (mat.rank + n),
          [&](size_t b, size_t e) {
            std::vector<float> rows(kRowBlock * mat.cols);
            for (size_t i = b; i < e; i += kRowBlock) {
              const size_t r = std::min(kRowBlock, e - i);
              BlockApproximation(st.p.data() + mat.p_offset + i * mat.rank, r,
                                 qt_.data() + mat.q_offset, mat.cols, mat.rank,
                                 rows.data());
              // The error update is deferred to the next pass 1 (above).
              WriteResult(rows.data(), mat.offset + i * mat.cols, r * mat.cols,
                          grads.data(), n, count,
                          /*error=*/nullptr, stream);
            }
            if (stream)
              FenceStreamingStores(); // on the thread that wrote
          });
  }
  if (error_feedback_) {
    st.prev_p = st.p;
    st.prev_qt = qt_;
    st.deferred_ranks = n;
    st.deferred = true;
  }
  st.has_memory = warm_start_;
  lap(t.pass3_s);
  if (st.timed) {
    t.runs = 1;
  } else { // allocated the bucket's error: apart
    st.timed = true;
    PhaseTimes first;
    first.first_runs = 1;
    first.first_runs_s = t.total_s();
    t = first;
  }
  times_ += t;
  return absl::OkStatus();
}

} // namespace gradd
