// PowerSGD (torch's powerSGD_hook.powerSGD_hook and batched_powerSGD_hook)
// run by the daemon, with the hook's state -- the node's error feedback,
// the P/Q memory of warm start, the iteration count and the
// random generator -- kept per job here.
//
// Per bucket and iteration t (torch's state.iter is t - 1):
//
//   t <= start_powersgd_iter   vanilla average (sum of the local ranks,
//                              AllreduceSum, divide)
//   afterwards                 M_r = grad_r + e_r (error feedback) for each
//                              local rank r; M = sum of the node's M_r,
//                              computed as E + sum of the grad_r, where
//                              E = sum of the node's e_r (below).
//     powerSGD: the bucket's parameters viewed as n x m matrices
//       (shape[0] x rest); those worth compressing (torch's
//       _should_compress with rank min(n, m, R)) in torch's order (grouped
//       by shape, first appearance first); the rest (vectors, small
//       matrices) are summed, AllreduceSum'd and divided uncompressed.
//     batched_powerSGD: the whole bucket, zero-padded, as one square
//       matrix of side ceil(sqrt(count)) and rank R.
//     Q: drawn afresh (every iteration without warm start, the first
//       compressed one with it) as torch draws it -- a seed from
//       numpy.random.RandomState(random_seed).randint(1e9) per bucket in
//       bucket order, torch.manual_seed(seed), torch.randn per matrix
//       (torch_random.h) -- else the previous iteration's Q; then
//       orthogonalised (Gram-Schmidt with epsilon; batched: epsilon 0).
//     P = M Q, AllreduceSum(P), orthogonalise P; Q = M^T P, AllreduceSum(Q),
//     Q /= world size; result = P Q^T in every local rank's bucket, and
//     e_r = M_r - result, so E = M - (local ranks) x result.
//   Since P and Q are linear in M, summing the node's ranks first and
//   allreducing across nodes gives torch's sums over all ranks; and since
//   every rank gets the same result, the node needs only the sum E of its
//   ranks' errors, never each e_r (a third of the memory traffic of
//   keeping them apart). The bucket is read three times (powersgd_hook.cc),
//   and the error of the compressed matrices is updated one iteration
//   late (the next pass 1 subtracts the kept P Q^T: the same E, without
//   reading M again after the result).
//
// Differences from torch within rounding only: products are float32 fused
// multiply-adds summed in a fixed order (torch: its BLAS), so every CPU
// computes the same bits (the kernels: powersgd_kernels.h); for rank > 2
// torch orthogonalises by QR, which may flip column signs of P and Q -- the
// result P Q^T is the same -- and ignores epsilon. Buckets must be
// float32 (MakePowerSgdHook says otherwise). Thread-compatible
// (comm_hook.h: one caller, buckets in plan order).
#ifndef GRADD_SERVER_HOOKS_POWERSGD_HOOK_H_
#define GRADD_SERVER_HOOKS_POWERSGD_HOOK_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"
#include "gradd/v1/comm_hook.pb.h"
#include "server/hooks/comm_hook.h"
#include "server/hooks/comm_hook_factory.h"
#include "server/hooks/torch_random.h"

namespace gradd {

// INVALID_ARGUMENT for a plan with non-float32 buckets.
absl::StatusOr<std::unique_ptr<CommHookInterface>> MakePowerSgdHook(
    const v1::CommHookSpec& spec, const CommHookContext& context);

class PowerSgdHook final : public CommHookInterface {
 public:
  // Wall time of Run's phases, summed over the compressed runs (vanilla
  // runs and each bucket's first compressed run apart); logged once when
  // the hook is destroyed (the job's end).
  // The allreduce phases are the wire plus the wait for the slowest node.
  struct PhaseTimes {
    uint64_t runs = 0;          // compressed runs
    uint64_t vanilla_runs = 0;  // before start_powersgd_iter
    double vanilla_s = 0;
    double uncompressed_s = 0;  // sum, allreduce, write of the uncompressed
    double q_s = 0;             // draw / orthogonalise / transpose Q
    double pass1_s = 0;         // M (+ deferred error), P = M Q
    double allreduce_p_s = 0;
    double orthogonalize_p_s = 0;
    double pass2_s = 0;  // Q = M^T P
    double allreduce_q_s = 0;
    double pass3_s = 0;  // P Q^T into the ranks' buckets
    // The first compressed run of each bucket (it allocates and zeroes the
    // bucket's error), apart: the phases above are the later runs'.
    uint64_t first_runs = 0;
    double first_runs_s = 0;

    double total_s() const;
    PhaseTimes& operator+=(const PhaseTimes& t);
  };

  // One compressed matrix: rows x cols at element `offset` of the (padded)
  // bucket, approximated with `rank` columns; its P and Q at p_offset /
  // q_offset of the bucket's P and Q memory.
  struct Matrix {
    size_t offset = 0;
    size_t rows = 0;
    size_t cols = 0;
    size_t rank = 0;
    size_t p_offset = 0;
    size_t q_offset = 0;
  };
  struct Layout {
    size_t count = 0;   // bucket elements
    size_t padded = 0;  // elements of the working vectors (batched: side^2)
    // Uncompressed (offset, numel) ranges in bucket order.
    std::vector<std::pair<size_t, size_t>> uncompressed;
    std::vector<Matrix> matrices;  // torch's qs order
    size_t p_size = 0;
    size_t q_size = 0;
  };

  // `spec` normalised (NormalizeCommHookSpec); one layout per bucket. The
  // matrix products of large matrices are split across `pool` (may be
  // null; must outlive the hook).
  PowerSgdHook(const v1::CommHookSpec& spec, int world_size,
               std::vector<Layout> layouts, ThreadPool* pool = nullptr);

  [[nodiscard]] absl::Status Run(const CommHookWork& work,
                                 CollectiveBackendInterface& net) override;
  std::string name() const override {
    return batched_ ? "batched_powerSGD" : "powerSGD";
  }
  ~PowerSgdHook() override;
  const PhaseTimes& phase_times() const { return times_; }
  // The line the destructor logs: "<name> hook over E bucket elements: R
  // compressed runs, ms per run: pass1=... (F first compressed runs, ms
  // per run ...; V vanilla runs, ms per run ...)"; bench/gradd-bench reads
  // it.
  std::string DescribePhaseTimes() const;

  // The layouts torch's hooks use for `plan` (exposed for tests).
  static std::vector<Layout> PerParameterLayouts(
      const std::vector<ParamInfo>& params, const BucketPlan& plan, int rank,
      double min_compression_rate);
  static std::vector<Layout> BatchedLayouts(const BucketPlan& plan, int rank);

 private:
  struct BucketState {
    // The node's error feedback: the sum of its local ranks' errors.
    std::vector<float> error;
    std::vector<float> p;
    std::vector<float> q;
    bool has_memory = false;  // warm start: q holds last iteration's Q
    bool timed = false;       // had its first compressed run (PhaseTimes)
    // Error feedback, deferred (powersgd_hook.cc, Run): `error` holds the
    // last M of the compressed matrices; their error is that M minus
    // deferred_ranks * prev_p prev_qt (P, and Q^T divided by the world
    // size, as the result was computed).
    bool deferred = false;
    int deferred_ranks = 0;
    std::vector<float> prev_p;
    std::vector<float> prev_qt;
  };

  absl::Status Vanilla(const CommHookWork& work,
                       CollectiveBackendInterface& net);
  // The seed torch draws for the `index`-th randomisation of the job
  // (bucket order within an iteration).
  int64_t Seed(uint64_t index);

  const bool batched_;
  const int64_t start_iter_;
  const bool error_feedback_;
  const bool warm_start_;
  const float epsilon_;
  const int world_size_;
  const std::vector<Layout> layouts_;
  std::vector<BucketState> states_;
  ThreadPool* const pool_;

  PhaseTimes times_;
  NumpyRandomState rng_;
  TorchCpuRandom torch_rng_;
  uint64_t next_draw_ = 0;
  std::map<uint64_t, int64_t> drawn_;

  // Scratch kept between calls: the node's M (without error feedback),
  // the uncompressed pack, Q transposed.
  std::vector<float> m_sum_;
  std::vector<float> packed_;
  std::vector<float> qt_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_HOOKS_POWERSGD_HOOK_H_
