#include "server/hooks/powersgd_hook.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/reduce.h"

namespace gradd {
namespace {

constexpr int64_t kSeedBound = 1000000000;  // torch: rng.randint(1_000_000_000)

// Gram-Schmidt over the `cols` columns of a row-major rows x cols matrix,
// torch's _orthogonalize_gram_schmidt: each column divided by its norm
// (+ epsilon), then projected out of the later columns.
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

// Below this many multiply-adds a product runs on the calling thread.
constexpr size_t kMinParallelWork = 1 << 18;

// fn(begin, end) over [0, n) rows or columns of a product costing `work`
// multiply-adds, split across `pool` when that pays off.
void Split(ThreadPool* pool, size_t n, size_t work,
           absl::FunctionRef<void(size_t, size_t)> fn) {
  if (pool == nullptr || n < 2 || work < 2 * kMinParallelWork) {
    fn(0, n);
    return;
  }
  const size_t per = std::max<size_t>(1, kMinParallelWork / (work / n));
  pool->ParallelFor(n, per, fn);
}

// The three products, each for a rank known at compile time (R > 0: the
// accumulators live in registers and the loops over k unroll) or at run
// time (R == 0). Every output element is accumulated in double in the same
// order either way, so the results are bit-identical.
template <size_t R>
struct Rank {
  static constexpr size_t kMax = R;
  size_t operator()(size_t) const { return R; }
};
template <>
struct Rank<0> {
  // comm_hook_factory.cc refuses matrix_approximation_rank above 1024.
  static constexpr size_t kMax = 1024;
  size_t operator()(size_t rank) const { return rank; }
};

// p (rows x rank) = m (rows x cols) q (cols x rank), rows [begin, end).
template <size_t R>
void MulQFor(const float* m, const float* q, float* p, size_t cols,
             size_t rank_in, size_t begin, size_t end) {
  const size_t rank = Rank<R>()(rank_in);
  for (size_t i = begin; i < end; ++i) {
    double acc[Rank<R>::kMax];
    for (size_t k = 0; k < rank; ++k) acc[k] = 0.0;
    const float* row = m + i * cols;
    for (size_t j = 0; j < cols; ++j) {
      const double mij = row[j];
      const float* qj = q + j * rank;
      for (size_t k = 0; k < rank; ++k) acc[k] += mij * qj[k];
    }
    for (size_t k = 0; k < rank; ++k) {
      p[i * rank + k] = static_cast<float>(acc[k]);
    }
  }
}

// q (cols x rank) = m^T (cols x rows) p (rows x rank), q's rows (m's
// columns) [begin, end).
template <size_t R>
void MulTransposedPFor(const float* m, const float* p, float* q, size_t rows,
                       size_t cols, size_t rank_in, size_t begin, size_t end,
                       std::vector<double>& acc) {
  const size_t rank = Rank<R>()(rank_in);
  acc.assign((end - begin) * rank, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    const float* row = m + i * cols;
    double pi[Rank<R>::kMax];
    for (size_t k = 0; k < rank; ++k) pi[k] = p[i * rank + k];
    double* aj = acc.data();
    for (size_t j = begin; j < end; ++j, aj += rank) {
      const double mij = row[j];
      for (size_t k = 0; k < rank; ++k) aj[k] += mij * pi[k];
    }
  }
  for (size_t i = 0; i < (end - begin) * rank; ++i) {
    q[begin * rank + i] = static_cast<float>(acc[i]);
  }
}

// out (rows x cols) = p (rows x rank) q^T (rank x cols), rows [begin, end).
template <size_t R>
void ApproximateFor(const float* p, const float* q, float* out, size_t cols,
                    size_t rank_in, size_t begin, size_t end) {
  const size_t rank = Rank<R>()(rank_in);
  for (size_t i = begin; i < end; ++i) {
    double pi[Rank<R>::kMax];
    for (size_t k = 0; k < rank; ++k) pi[k] = p[i * rank + k];
    float* row = out + i * cols;
    for (size_t j = 0; j < cols; ++j) {
      const float* qj = q + j * rank;
      double s = 0;
      for (size_t k = 0; k < rank; ++k) s += pi[k] * qj[k];
      row[j] = static_cast<float>(s);
    }
  }
}

void MulQ(const float* m, const float* q, float* p, size_t cols, size_t rank,
          size_t begin, size_t end) {
  switch (rank) {
    case 1:
      return MulQFor<1>(m, q, p, cols, rank, begin, end);
    case 2:
      return MulQFor<2>(m, q, p, cols, rank, begin, end);
    case 4:
      return MulQFor<4>(m, q, p, cols, rank, begin, end);
    case 8:
      return MulQFor<8>(m, q, p, cols, rank, begin, end);
    default:
      return MulQFor<0>(m, q, p, cols, rank, begin, end);
  }
}

void MulTransposedP(const float* m, const float* p, float* q, size_t rows,
                    size_t cols, size_t rank, size_t begin, size_t end) {
  std::vector<double> acc;
  switch (rank) {
    case 1:
      return MulTransposedPFor<1>(m, p, q, rows, cols, rank, begin, end, acc);
    case 2:
      return MulTransposedPFor<2>(m, p, q, rows, cols, rank, begin, end, acc);
    case 4:
      return MulTransposedPFor<4>(m, p, q, rows, cols, rank, begin, end, acc);
    case 8:
      return MulTransposedPFor<8>(m, p, q, rows, cols, rank, begin, end, acc);
    default:
      return MulTransposedPFor<0>(m, p, q, rows, cols, rank, begin, end, acc);
  }
}

void Approximate(const float* p, const float* q, float* out, size_t cols,
                 size_t rank, size_t begin, size_t end) {
  switch (rank) {
    case 1:
      return ApproximateFor<1>(p, q, out, cols, rank, begin, end);
    case 2:
      return ApproximateFor<2>(p, q, out, cols, rank, begin, end);
    case 4:
      return ApproximateFor<4>(p, q, out, cols, rank, begin, end);
    case 8:
      return ApproximateFor<8>(p, q, out, cols, rank, begin, end);
    default:
      return ApproximateFor<0>(p, q, out, cols, rank, begin, end);
  }
}

}  // namespace

std::vector<PowerSgdHook::Layout> PowerSgdHook::PerParameterLayouts(
    const std::vector<ParamInfo>& params, const BucketPlan& plan, int rank,
    double min_compression_rate) {
  std::vector<Layout> layouts;
  for (const Bucket& bucket : plan.buckets) {
    Layout layout;
    const size_t elem = DTypeSize(bucket.dtype);
    layout.count = bucket.size_bytes / elem;
    layout.padded = layout.count;
    // torch groups the matrices to compress by shape, in the order each
    // shape first appears, and lays out P and Q in that order.
    std::vector<std::pair<size_t, size_t>> shapes;  // (rows, cols)
    std::vector<std::vector<Matrix>> groups;
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      const ParamInfo& param = params[bucket.params[k]];
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
    for (std::vector<Matrix>& group : groups) {
      for (Matrix& m : group) {
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

std::vector<PowerSgdHook::Layout> PowerSgdHook::BatchedLayouts(
    const BucketPlan& plan, int rank) {
  std::vector<Layout> layouts;
  for (const Bucket& bucket : plan.buckets) {
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

absl::StatusOr<std::unique_ptr<CommHookInterface>> MakePowerSgdHook(
    const v1::CommHookSpec& spec, const CommHookContext& context) {
  const v1::CommHookSpec n = NormalizeCommHookSpec(spec);
  // The model's buckets only: gradd's own (Bucket::internal, planned after
  // every model bucket) never go through the hook, and torch's random draws
  // are numbered over the model's buckets.
  BucketPlan model_plan;
  for (const Bucket& b : context.plan->buckets) {
    if (!b.internal) model_plan.buckets.push_back(b);
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

PowerSgdHook::PowerSgdHook(const v1::CommHookSpec& spec, int world_size,
                           std::vector<Layout> layouts, ThreadPool* pool)
    : batched_(spec.name() == "batched_powerSGD"),
      start_iter_(spec.start_powersgd_iter()),
      error_feedback_(spec.use_error_feedback()),
      warm_start_(spec.warm_start()),
      // batched_powerSGD_hook orthogonalises without the state's epsilon.
      epsilon_(batched_ ? 0.0f
                        : static_cast<float>(spec.orthogonalization_epsilon())),
      world_size_(world_size),
      layouts_(std::move(layouts)),
      states_(layouts_.size()),
      pool_(pool),
      rng_(static_cast<uint32_t>(spec.random_seed())) {}

int64_t PowerSgdHook::Seed(uint64_t index) {
  while (next_draw_ <= index) drawn_[next_draw_++] = rng_.RandInt(kSeedBound);
  auto it = drawn_.find(index);
  const int64_t seed = it->second;
  drawn_.erase(it);
  return seed;
}

absl::Status PowerSgdHook::Vanilla(const CommHookWork& work,
                                   CollectiveBackendInterface& net) {
  const std::vector<void*>& buffers = *work.rank_buffers;
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

absl::Status PowerSgdHook::Run(const CommHookWork& work,
                               CollectiveBackendInterface& net) {
  if (work.bucket < 0 || work.bucket >= static_cast<int>(layouts_.size()) ||
      work.dtype != DType::kFloat32 ||
      work.count != layouts_[work.bucket].count) {
    return absl::InternalError(absl::StrCat(name(), ": bucket ", work.bucket,
                                            " does not match the job's plan"));
  }
  // torch's state.iter is the number of finished iterations.
  if (static_cast<int64_t>(work.iteration) - 1 < start_iter_) {
    return Vanilla(work, net);
  }
  const Layout& layout = layouts_[work.bucket];
  BucketState& st = states_[work.bucket];
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  const size_t count = layout.count;
  const size_t len = layout.padded;

  // M_r = grad_r (zero-padded) + e_r; M = sum of the node's M_r. One
  // parallel pass over the bucket; with error feedback M_r is kept in e_r's
  // memory (e_r = M_r - result at the end), without it M_r is not needed.
  if (error_feedback_ && st.error.empty()) {
    st.error.assign(n, std::vector<float>(len, 0.0f));
  }
  m_sum_.resize(len);
  out_.resize(len);
  Split(pool_, len, len, [&](size_t b, size_t e) {
    std::fill(m_sum_.begin() + b, m_sum_.begin() + e, 0.0f);
    std::fill(out_.begin() + b, out_.begin() + e, 0.0f);
    const size_t g_end = std::min(e, count);
    for (int r = 0; r < n; ++r) {
      const float* g = static_cast<const float*>(buffers[r]);
      float* sum = m_sum_.data();
      if (error_feedback_) {
        float* m = st.error[r].data();
        for (size_t i = b; i < g_end; ++i) m[i] += g[i];
        for (size_t i = b; i < e; ++i) sum[i] += m[i];
      } else {
        for (size_t i = b; i < g_end; ++i) sum[i] += g[i];
      }
    }
  });

  // Uncompressed tensors: averaged as they are.
  size_t packed_size = 0;
  for (const auto& [offset, numel] : layout.uncompressed) packed_size += numel;
  if (!batched_) {
    packed_.resize(packed_size);
    size_t at = 0;
    for (const auto& [offset, numel] : layout.uncompressed) {
      std::copy(m_sum_.begin() + offset, m_sum_.begin() + offset + numel,
                packed_.begin() + at);
      at += numel;
    }
    if (absl::Status s =
            net.AllreduceSum(packed_.data(), packed_size, DType::kFloat32);
        !s.ok()) {
      return s;
    }
    at = 0;
    const float world = static_cast<float>(world_size_);
    for (const auto& [offset, numel] : layout.uncompressed) {
      for (size_t i = 0; i < numel; ++i) {
        out_[offset + i] = packed_[at + i] / world;
      }
      at += numel;
    }
  }

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
    for (const Matrix& m : layout.matrices) {
      torch_rng_.Randn(st.q.data() + m.q_offset, m.cols * m.rank);
    }
  }
  for (const Matrix& m : layout.matrices) {
    Orthogonalize(st.q.data() + m.q_offset, m.cols, m.rank, epsilon_);
  }
  // P = M Q, summed over every rank.
  for (const Matrix& m : layout.matrices) {
    Split(pool_, m.rows, m.rows * m.cols * m.rank, [&](size_t b, size_t e) {
      MulQ(m_sum_.data() + m.offset, st.q.data() + m.q_offset,
           st.p.data() + m.p_offset, m.cols, m.rank, b, e);
    });
  }
  if (absl::Status s =
          net.AllreduceSum(st.p.data(), layout.p_size, DType::kFloat32);
      !s.ok()) {
    return s;
  }
  for (const Matrix& m : layout.matrices) {
    Orthogonalize(st.p.data() + m.p_offset, m.rows, m.rank, epsilon_);
  }
  // Q = M^T P, summed over every rank, divided by the world size.
  for (const Matrix& m : layout.matrices) {
    Split(pool_, m.cols, m.rows * m.cols * m.rank, [&](size_t b, size_t e) {
      MulTransposedP(m_sum_.data() + m.offset, st.p.data() + m.p_offset,
                     st.q.data() + m.q_offset, m.rows, m.cols, m.rank, b, e);
    });
  }
  if (absl::Status s =
          net.AllreduceSum(st.q.data(), layout.q_size, DType::kFloat32);
      !s.ok()) {
    return s;
  }
  const float world = static_cast<float>(world_size_);
  for (float& v : st.q) v /= world;
  for (const Matrix& m : layout.matrices) {
    Split(pool_, m.rows, m.rows * m.cols * m.rank, [&](size_t b, size_t e) {
      Approximate(st.p.data() + m.p_offset, st.q.data() + m.q_offset,
                  out_.data() + m.offset, m.cols, m.rank, b, e);
    });
  }
  st.has_memory = warm_start_;

  // e_r = M_r - result and the result into every local rank's bucket, in
  // one parallel pass.
  Split(pool_, len, len, [&](size_t b, size_t e) {
    const float* o = out_.data();
    for (int r = 0; r < n; ++r) {
      if (error_feedback_) {
        float* m = st.error[r].data();
        for (size_t i = b; i < e; ++i) m[i] -= o[i];
      }
      if (b < count) {
        std::copy(o + b, o + std::min(e, count),
                  static_cast<float*>(buffers[r]) + b);
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace gradd
