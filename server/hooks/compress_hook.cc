#include "server/hooks/compress_hook.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/reduce.h"
#include "common/split_across_pool.h"

namespace gradd {
namespace {

// Buckets of more than two chunks are pipelined (Compress16Hook::Pipelined).
// 2 MiB of 16-bit values per chunk: large enough that a collective's fixed
// cost is small next to its transfer, small enough that the first chunk is
// on the wire after a fraction of the bucket has been compressed.
constexpr size_t kPipelineChunk = size_t{1} << 20;

}  // namespace

absl::Status Compress16Hook::Run(const CommHookWork& work,
                                 CollectiveBackendInterface& net) {
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  const size_t count = work.count;
  if (count == 0 || n == 0) return absl::OkStatus();
  wire_buf_.resize(count);
  void* wire = wire_buf_.data();
  const double world = world_size_;

  if (work.dtype == DType::kFloat64) {
    // Rare (float64 models): plain loops through double.
    acc64_.assign(count, 0.0);
    for (int r = 0; r < n; ++r) {
      const double* in = static_cast<const double*>(buffers[r]);
      for (size_t i = 0; i < count; ++i) acc64_[i] += in[i];
    }
    for (size_t i = 0; i < count; ++i) {
      const float v = static_cast<float>(acc64_[i] / world);
      wire_buf_[i] =
          wire_ == DType::kFloat16 ? FloatToHalf(v) : FloatToBFloat16(v);
    }
    if (absl::Status s = net.AllreduceSum(wire, count, wire_); !s.ok()) {
      return s;
    }
    for (size_t i = 0; i < count; ++i) {
      const double v = wire_ == DType::kFloat16 ? HalfToFloat(wire_buf_[i])
                                                : BFloat16ToFloat(wire_buf_[i]);
      for (int r = 0; r < n; ++r) static_cast<double*>(buffers[r])[i] = v;
    }
    return absl::OkStatus();
  }

  // A backend that fuses the compression into its ring (GlooBackend) takes
  // a float32 bucket whole: the same values, with every pass overlapping
  // the network segment by segment.
  if (work.dtype == DType::kFloat32 && net.FusesCompressedAverage()) {
    LocalAverage average;
    average.dtype = DType::kFloat32;
    average.buffers = buffers;
    average.to_sum = n;
    average.count = count;
    average.divisor = world;
    average.wire = wire_;
    return net.AllreduceAverage(average);
  }

  // float32 buckets sum in place into local rank 0's bucket; 16-bit buckets
  // into a private float32 accumulator.
  void* acc = buffers[0];
  if (work.dtype != DType::kFloat32) {
    acc_.resize(count);
    acc = acc_.data();
  }
  void* const wire_out[1] = {wire};
  auto compress = [&](size_t begin, size_t end) {
    SplitAcrossPool(
        pool_, DType::kFloat32, begin, end, [&](size_t b, size_t e) {
          SumToAccumulator(work.dtype, buffers.data(), n, acc, b, e);
          // Divided in float32 and rounded once to 16 bits.
          ScatterFromAccumulator(wire_, acc, world, wire_out, 1, b, e);
        });
  };
  const void* const wire_in[1] = {wire};
  auto decompress = [&](size_t begin, size_t end) {
    SplitAcrossPool(
        pool_, DType::kFloat32, begin, end, [&](size_t b, size_t e) {
          // 16 bits -> float32 -> every local rank's bucket.
          SumToAccumulator(wire_, wire_in, 1, acc, b, e);
          ScatterFromAccumulator(work.dtype, acc, 1.0, buffers.data(), n, b, e);
        });
  };
  if (count <= 2 * kPipelineChunk) {
    compress(0, count);
    if (absl::Status s = net.AllreduceSum(wire, count, wire_); !s.ok()) {
      return s;
    }
    decompress(0, count);
    return absl::OkStatus();
  }
  return Pipelined(count, compress, decompress, net);
}

// Chunk c + 1 is compressed (this thread, with the pool) while chunk c is
// on the network (a thread of its own, which makes every call on the
// backend, in chunk order: the same collectives on every node), and chunk c
// is decompressed as soon as its allreduce is done. The values are those of
// the unchunked path: every element is summed across the nodes in 16 bits
// exactly once either way.
absl::Status Compress16Hook::Pipelined(
    size_t count, absl::FunctionRef<void(size_t, size_t)> compress,
    absl::FunctionRef<void(size_t, size_t)> decompress,
    CollectiveBackendInterface& net) {
  const size_t chunks = (count + kPipelineChunk - 1) / kPipelineChunk;
  auto begin_of = [&](size_t c) { return c * kPipelineChunk; };
  auto end_of = [&](size_t c) {
    return std::min(count, (c + 1) * kPipelineChunk);
  };
  std::mutex mu;
  std::condition_variable cv;
  size_t compressed = 0;  // guarded by mu
  size_t reduced = 0;     // guarded by mu
  bool failed = false;    // guarded by mu
  absl::Status net_status;
  std::thread network([&] {
    for (size_t c = 0; c < chunks; ++c) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return compressed > c; });
      }
      absl::Status s = net.AllreduceSum(wire_buf_.data() + begin_of(c),
                                        end_of(c) - begin_of(c), wire_);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (s.ok()) {
          reduced = c + 1;
        } else {
          net_status = std::move(s);
          failed = true;
        }
      }
      cv.notify_all();
      if (failed) return;  // only this thread writes it
    }
  });
  for (size_t c = 0; c < chunks; ++c) {
    compress(begin_of(c), end_of(c));
    {
      std::lock_guard<std::mutex> lock(mu);
      compressed = c + 1;
    }
    cv.notify_all();
  }
  for (size_t c = 0; c < chunks; ++c) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return reduced > c || failed; });
      if (reduced <= c) break;
    }
    decompress(begin_of(c), end_of(c));
  }
  network.join();
  return net_status;
}

}  // namespace gradd
