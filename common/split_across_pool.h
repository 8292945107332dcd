// SplitAcrossPool: the daemon's rule for when a second core pays for itself
// on a bucket's element range. Used by the reducers (server/engine/reduce/)
// and the compression hook (server/hooks/), so it lives below both.
#ifndef GRADD_COMMON_SPLIT_ACROSS_POOL_H_
#define GRADD_COMMON_SPLIT_ACROSS_POOL_H_

#include <cstddef>

#include "absl/functional/function_ref.h"
#include "common/dtype.h"
#include "common/thread_pool.h"

namespace gradd {

// Runs fn(b, e) over [begin, end) of a bucket of `dtype`, split across
// `pool` (inline when pool is null or the range is small).
void SplitAcrossPool(ThreadPool* pool, DType dtype, size_t begin, size_t end,
                     absl::FunctionRef<void(size_t, size_t)> fn);

}  // namespace gradd

#endif  // GRADD_COMMON_SPLIT_ACROSS_POOL_H_
