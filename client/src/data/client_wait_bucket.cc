// ClientImpl::WaitBucketOn: waiting for one bucket of the current iteration
// (client.h, WaitBucket). The daemon publishes done_seq[b] = iteration bucket
// by bucket (common/control_block.h), so this is WaitAll's wait for a single
// bucket; the iteration itself still ends in WaitAll, which finds every
// bucket done and only moves on.
#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/src/data/client_impl.h"
#include "common/status_macros.h"

namespace gradd::internal {

absl::Status ClientImpl::WaitBucketOn(int bucket, void* cuda_stream) {
  RETURN_IF_ERROR(CheckFailed());
  if (bucket < 0 || bucket >= num_buckets()) {
    return absl::OutOfRangeError(
        absl::StrCat("WaitBucket: bucket ", bucket, " out of range [0, ",
                     num_buckets(), ") (", Who(), ")"));
  }
  const uint64_t it = iteration_.load(std::memory_order_relaxed);
  const int32_t left = pending_[bucket].load(std::memory_order_acquire);
  if (left != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "WaitBucket(", bucket, ") in iteration ", it, " (", Who(), "): ", left,
        " of its ", buckets_[bucket].params.size(),
        " parameters are not marked ready yet; mark every parameter of a "
        "bucket before waiting for it"));
  }
  std::atomic<uint64_t>& done = done_seq_[bucket];
  RETURN_IF_ERROR(
      Wait([&done, it] { return done.load(std::memory_order_acquire) >= it; },
           absl::StrCat("bucket ", bucket, " of iteration ", it)));
  // Rank restart: the daemon marked every bucket done without averaging;
  // WaitAll ends the iteration and reports the abort, as it would have.
  if (restart_.IterationAborted(it)) return WaitAllOn(cuda_stream);
  if (buckets_[bucket].device != 0) {
    if (absl::Status s = device_->WaitDone(bucket, cuda_stream); !s.ok()) {
      return Fail(s);
    }
  }
  return absl::OkStatus();
}

}  // namespace gradd::internal
