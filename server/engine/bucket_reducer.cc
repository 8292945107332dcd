#include "server/engine/bucket_reducer.h"

#include <algorithm>

#include "common/reduce.h"

namespace gradd {
namespace {

// Below this many bytes per chunk, waking a second core costs more than the
// memory traffic it would take over (a 256 KiB average runs in ~20 us).
constexpr size_t kMinChunkBytes = 256 << 10;

}  // namespace

void FusedReducer::Start(const BucketWork& work, Completion done) {
  const std::vector<void*>& buffers = *work.rank_buffers;
  const int n = static_cast<int>(buffers.size());
  auto body = [&](size_t begin, size_t end) {
    FusedAverage(work.dtype, buffers.data(), n, begin, end, divisor_);
  };
  if (pool_ == nullptr) {
    body(0, work.count);
  } else {
    size_t min_chunk =
        std::max<size_t>(1, kMinChunkBytes / DTypeSize(work.dtype));
    pool_->ParallelFor(work.count, min_chunk, body);
  }
  std::move(done)(absl::OkStatus());
}

}  // namespace gradd
