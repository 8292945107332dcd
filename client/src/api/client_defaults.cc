// Client's default implementations of the CUDA-stream calls, for clients
// that have no device buckets (wrappers override them to forward).
#include "gradd/client.h"

namespace gradd {

absl::Status Client::MarkReadyOn(int param, void*) { return MarkReady(param); }

absl::Status Client::WaitAllOn(void*) { return WaitAll(); }

// Clients without per-bucket waits (test fakes).
absl::Status Client::WaitBucketOn(int, void*) {
  return absl::UnimplementedError("WaitBucket is not supported by this client");
}

}  // namespace gradd

namespace gradd {

// Collectives: clients that do not implement them (wrappers, test fakes).
absl::Status Client::Allreduce(void*, size_t, int32_t, ReduceOp) {
  return absl::UnimplementedError("Allreduce is not supported by this client");
}

absl::Status Client::Allgather(const void*, size_t, void*) {
  return absl::UnimplementedError("Allgather is not supported by this client");
}

absl::Status Client::ReduceScatter(const void*, void*, size_t, int32_t,
                                   ReduceOp) {
  return absl::UnimplementedError(
      "ReduceScatter is not supported by this client");
}

absl::Status Client::Barrier() {
  return absl::UnimplementedError("Barrier is not supported by this client");
}

}  // namespace gradd

namespace gradd {

bool IsIterationAborted(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted &&
         status.GetPayload(kIterationAbortedPayload).has_value();
}

// Rank restart: clients without it never restart, so no sync is ever due.
absl::StatusOr<int> Client::BeginStateSync() {
  return absl::FailedPreconditionError(
      "BeginStateSync: this client does not take part in rank restarts");
}

}  // namespace gradd
