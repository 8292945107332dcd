#include "client/src/plan/rebuild.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace gradd {

absl::StatusOr<PlanViews> RequestRebuild(v1::Node::Stub& stub,
                                         const RebuildCall& call) {
  v1::RebuildBucketsRequest request;
  request.set_job_id(call.job_id);
  request.set_local_rank(call.local_rank);
  request.set_session_id(call.session_id);
  request.set_iteration(call.next_iteration - 1);
  for (int32_t p : call.ready_order) request.add_ready_order(p);
  v1::RebuildBucketsResponse response;
  grpc::ClientContext context;
  // A year at most, so that "forever" cannot overflow the clock.
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::clamp(call.timeout, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(std::chrono::hours(24 * 365))));
  grpc::Status rpc = stub.RebuildBuckets(&context, request, &response);
  if (!rpc.ok()) {
    absl::Status s = FromGrpcStatus(rpc);
    return absl::Status(s.code(), absl::StrCat("bucket rebuild (", call.who,
                                               ") failed: ", s.message()));
  }
  absl::StatusOr<PlanViews> views = MapPlanViews(
      response.buckets(), *call.names, *call.dtypes, *call.bytes, call.base,
      call.region_bytes, call.device_base, call.device_bytes);
  if (!views.ok() || response.first_iteration() != call.next_iteration) {
    return absl::InternalError(absl::StrCat(
        "gradd sent an inconsistent rebuilt plan (", call.who, "): ",
        views.ok() ? absl::StrCat(
                         "it starts at iteration ", response.first_iteration(),
                         ", the next iteration is ", call.next_iteration)
                   : std::string(views.status().message())));
  }
  if (call.next_switch_after != nullptr) {
    *call.next_switch_after = response.next_switch_after();
  }
  return views;
}

ReadyOrderRecorder::ReadyOrderRecorder(size_t num_params, bool enabled)
    : size_(num_params),
      enabled_(enabled),
      order_(std::make_unique<std::atomic<int32_t>[]>(num_params)) {}

void ReadyOrderRecorder::EndIteration() {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  const size_t n = next_.exchange(0, std::memory_order_relaxed);
  if (n != size_) return;
  std::vector<int32_t> order(size_);
  std::vector<bool> seen(size_, false);
  for (size_t k = 0; k < size_; ++k) {
    const int32_t p = order_[k].load(std::memory_order_relaxed);
    if (p < 0 || static_cast<size_t>(p) >= size_ || seen[p]) return;
    seen[p] = true;
    order[k] = p;
  }
  last_ = std::move(order);
  if (++iterations_ == kRecordedIterations) Stop();
}

}  // namespace gradd
