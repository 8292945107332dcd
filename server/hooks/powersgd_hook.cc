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
#include "server/hooks/powersgd_kernels.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

using powersgd::kRowBlock;

constexpr int64_t kSeedBound = 1000000000;  // torch: rng.randint(1_000_000_000)

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

// Buckets from this size on are written with streaming stores.
constexpr size_t kStreamMinBytes = size_t{4} << 20;

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

double PowerSgdHook::PhaseTimes::total_s() const {
  return vanilla_s + uncompressed_s + q_s + pass1_s + allreduce_p_s +
         orthogonalize_p_s + pass2_s + allreduce_q_s + pass3_s + first_runs_s;
}

PowerSgdHook::PhaseTimes& PowerSgdHook::PhaseTimes::operator+=(
    const PhaseTimes& t) {
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
  for (const Layout& l : layouts_) elements += l.count;
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
  PhaseTimes t;  // this run's
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  // Adds the time since the last lap to `phase`.
  auto lap = [&last](double& phase) {
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
  const Layout& layout = layouts_[work.bucket];
  BucketState& st = states_[work.bucket];
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  const size_t count = layout.count;
  const size_t len = layout.padded;
  std::vector<float*> grads(n);
  for (int r = 0; r < n; ++r) grads[r] = static_cast<float*>(buffers[r]);

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
  float* m;
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
  float* const error = error_feedback_ ? m : nullptr;
  auto sum_range = [&](size_t b, size_t e) {
    powersgd::SumInto(m, grads.data(), n, count, error_feedback_, b, e);
  };

  // Uncompressed tensors: averaged as they are.
  size_t packed_size = 0;
  for (const auto& [offset, numel] : layout.uncompressed) packed_size += numel;
  if (!batched_ && packed_size > 0) {
    packed_.resize(packed_size);
    size_t at = 0;
    for (const auto& [offset, numel] : layout.uncompressed) {
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
    for (float& v : packed_) v /= world;
    at = 0;
    for (const auto& [offset, numel] : layout.uncompressed) {
      powersgd::WriteResult(packed_.data() + at, offset, numel, grads.data(), n,
                            count, error);
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
    for (const Matrix& mat : layout.matrices) {
      torch_rng_.Randn(st.q.data() + mat.q_offset, mat.cols * mat.rank);
    }
  }
  qt_.resize(layout.q_size);
  for (const Matrix& mat : layout.matrices) {
    powersgd::Orthogonalize(st.q.data() + mat.q_offset, mat.cols, mat.rank,
                            epsilon_);
    powersgd::Transpose(st.q.data() + mat.q_offset, mat.cols, mat.rank,
                        qt_.data() + mat.q_offset);
  }
  lap(t.q_s);
  // Pass 1: M row by row (after last iteration's deferred error update),
  // and P = M Q (summed over every rank below).
  const bool deferred = st.deferred;
  st.deferred = false;  // from here on E's memory holds the new M
  std::vector<const float*> mat_grads(n);
  for (const Matrix& mat : layout.matrices) {
    for (int r = 0; r < n; ++r) mat_grads[r] = grads[r] + mat.offset;
    powersgd::Pass1Matrix a;
    a.m = m + mat.offset;
    a.g = mat_grads.data();
    a.n = n;
    a.valid = count > mat.offset ? count - mat.offset : 0;
    a.rows = mat.rows;
    a.cols = mat.cols;
    a.rank = mat.rank;
    a.keep = error_feedback_;
    if (deferred) {
      a.prev_p = st.prev_p.data() + mat.p_offset;
      a.prev_qt = st.prev_qt.data() + mat.q_offset;
      a.deferred_ranks = static_cast<float>(st.deferred_ranks);
    }
    a.qt = qt_.data() + mat.q_offset;
    a.p = st.p.data() + mat.p_offset;
    const size_t terms = (deferred ? 2 * mat.rank : mat.rank) + n;
    Split(pool_, mat.rows, mat.rows * mat.cols * terms,
          [&](size_t b, size_t e) {
            for (size_t i = b; i < e; i += kRowBlock) {
              powersgd::Pass1Rows(a, i, std::min(kRowBlock, e - i));
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
  for (const Matrix& mat : layout.matrices) {
    powersgd::Orthogonalize(st.p.data() + mat.p_offset, mat.rows, mat.rank,
                            epsilon_);
  }
  lap(t.orthogonalize_p_s);
  // Pass 2: Q = M^T P, summed over every rank, divided by the world size.
  for (const Matrix& mat : layout.matrices) {
    Split(pool_, mat.cols, mat.rows * mat.cols * mat.rank,
          [&](size_t b, size_t e) {
            std::vector<float> acc;
            powersgd::TransposedTimesP(m + mat.offset,
                                       st.p.data() + mat.p_offset,
                                       st.q.data() + mat.q_offset, mat.rows,
                                       mat.cols, mat.rank, b, e, acc);
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
  for (float& v : st.q) v /= world;
  // Pass 3: the result P Q^T into every local rank's bucket, and the error.
  const bool stream = count * sizeof(float) >= kStreamMinBytes;
  std::vector<float*> mat_out(n);
  for (const Matrix& mat : layout.matrices) {
    powersgd::Transpose(st.q.data() + mat.q_offset, mat.cols, mat.rank,
                        qt_.data() + mat.q_offset);
    for (int r = 0; r < n; ++r) mat_out[r] = grads[r] + mat.offset;
    const size_t valid = count > mat.offset ? count - mat.offset : 0;
    // The error update is deferred to the next pass 1 (above).
    Split(pool_, mat.rows, mat.rows * mat.cols * (mat.rank + n),
          [&](size_t b, size_t e) {
            for (size_t i = b; i < e; i += kRowBlock) {
              powersgd::ResultRows(st.p.data() + mat.p_offset,
                                   qt_.data() + mat.q_offset, mat.cols,
                                   mat.rank, i, std::min(kRowBlock, e - i),
                                   mat_out.data(), n, valid, stream);
            }
            // On the thread that wrote.
            if (stream) powersgd::FenceStreamingStores();
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
  } else {  // allocated the bucket's error: apart
    st.timed = true;
    PhaseTimes first;
    first.first_runs = 1;
    first.first_runs_s = t.total_s();
    t = first;
  }
  times_ += t;
  return absl::OkStatus();
}

}  // namespace gradd
