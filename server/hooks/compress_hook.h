// fp16_compress_hook / bf16_compress_hook in the daemon: the bucket's global
// average travels between nodes as float16 (bfloat16) values.
//
//   node sum   the local ranks' buckets summed in float32 (float64 for
//              float64 buckets), split across the reduce pool
//   compress   divided by the job's world size and rounded to 16 bits
//   network    AllreduceSum of the 16-bit buffer (each addition rounded to
//              16 bits, as torch's Gloo allreduce of a float16 tensor does)
//   decompress the 16-bit result converted back into every local rank's
//              bucket
//
// Over GlooBackend (several nodes) a float32 bucket is handed to its fused
// ring as a whole (LocalAverage::wire): the stages run segment by segment
// inside the ring's schedule. Otherwise, large buckets go through the three
// stages in chunks, pipelined: the
// network carries one chunk while the next is compressed and the previous
// one decompressed, so the compression passes overlap the transfer instead
// of adding to it.
//
// torch rounds each rank's gradient to 16 bits before dividing and sums the
// ranks in 16 bits; gradd sums a node's ranks in float32 first, so its
// result is never further from the exact average than torch's (within a
// few 16-bit units in the last place of it). Thread-compatible (see
// comm_hook.h).
#ifndef GRADD_SERVER_HOOKS_COMPRESS_HOOK_H_
#define GRADD_SERVER_HOOKS_COMPRESS_HOOK_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/thread_pool.h"
#include "server/hooks/comm_hook.h"

namespace gradd {

class Compress16Hook final : public CommHookInterface {
 public:
  // `wire` is kFloat16 or kBFloat16. `pool` (may be null) outlives the hook.
  Compress16Hook(DType wire, int world_size, ThreadPool* pool)
      : wire_(wire), world_size_(world_size), pool_(pool) {}

  [[nodiscard]] absl::Status Run(const CommHookWork& work,
                                 CollectiveBackendInterface& net) override;
  std::string name() const override {
    return wire_ == DType::kFloat16 ? "fp16_compress" : "bf16_compress";
  }

 private:
  absl::Status Pipelined(size_t count,
                         absl::FunctionRef<void(size_t, size_t)> compress,
                         absl::FunctionRef<void(size_t, size_t)> decompress,
                         CollectiveBackendInterface& net);

  const DType wire_;
  const int world_size_;
  ThreadPool* const pool_;
  // Scratch kept between calls (grown to the largest bucket): the node's
  // float32/float64 sum and the 16-bit wire buffer.
  std::vector<double> acc64_;
  std::vector<float> acc_;
  std::vector<uint16_t> wire_buf_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_HOOKS_COMPRESS_HOOK_H_
