// Test helpers: attach ranks through a NodeHandlerInterface and act as the
// trainer side of the control-block protocol (common/control_block.h).
#ifndef GRADD_TESTS_UNIT_ENGINE_MANAGER_TEST_RANK_H_
#define GRADD_TESTS_UNIT_ENGINE_MANAGER_TEST_RANK_H_

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/shm.h"
#include "gradd/v1/node.pb.h"
#include "server/rpc/node_handler.h"
#include "tests/unit/engine/manager/fake_session_registry.h"

namespace gradd {

struct PendingAttach {
  absl::Notification done;
  absl::StatusOr<v1::AttachResponse> result = absl::UnknownError("pending");

  // Waits (bounded) for the handler's answer.
  absl::StatusOr<v1::AttachResponse> Get(
      absl::Duration limit = absl::Seconds(20)) {
    if (!done.WaitForNotificationWithTimeout(limit)) {
      return absl::DeadlineExceededError("test: attach never answered");
    }
    return result;
  }
};

inline std::shared_ptr<PendingAttach> StartAttach(
    NodeHandlerInterface& handler, v1::AttachRequest request,
    absl::Duration deadline = absl::Seconds(20)) {
  auto pending = std::make_shared<PendingAttach>();
  handler.HandleAttach(std::move(request), absl::Now() + deadline,
                       [pending](absl::StatusOr<v1::AttachResponse> r) {
                         pending->result = std::move(r);
                         pending->done.Notify();
                       });
  return pending;
}

inline absl::Status Detach(NodeHandlerInterface& handler,
                           const std::string& job, int rank, uint64_t session) {
  v1::DetachRequest req;
  req.set_job_id(job);
  req.set_local_rank(rank);
  req.set_session_id(session);
  absl::Notification done;
  absl::Status out;
  handler.HandleDetach(req, [&](absl::Status s) {
    out = std::move(s);
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
    return absl::DeadlineExceededError("test: detach never answered");
  }
  return out;
}

struct TestParam {
  std::string name;
  std::vector<int64_t> shape;
  v1::DType dtype = v1::FLOAT32;
};

inline v1::AttachRequest MakeRequest(const std::string& job, int rank,
                                     int world, uint64_t session,
                                     const std::vector<TestParam>& params) {
  v1::AttachRequest req;
  req.set_job_id(job);
  req.set_local_rank(rank);
  req.set_local_world_size(world);
  req.set_session_id(session);
  for (const TestParam& p : params) {
    v1::ParamSpec* spec = req.add_params();
    spec->set_name(p.name);
    for (int64_t d : p.shape) spec->add_shape(d);
    spec->set_dtype(p.dtype);
  }
  return req;
}

// One attached rank as its trainer sees it: the control block and its own
// bucket memory, mapped from the fds the daemon sent.
class TestRank {
 public:
  TestRank(int rank, uint64_t session, v1::AttachResponse response,
           FakeSessionRegistry::Sent sent)
      : rank_(rank),
        session_(session),
        response_(std::move(response)),
        layout_(response_.world_size(), response_.bucket_slots() > 0
                                            ? response_.bucket_slots()
                                            : response_.buckets_size()) {
    control_ = *ControlMapping::MapRank(layout_, sent.fds.at(0).get(), rank_,
                                        sent.fds.at(2).get());
    memory_ =
        *Mapping::Map(sent.fds.at(1).get(), response_.rank_memory_bytes());
    header_ = layout_.header(control_.data());
    me_ = layout_.rank_header(control_.data(), rank_);
    bell_ = std::move(sent.fds.at(3));
  }

  int rank() const { return rank_; }
  uint64_t session() const { return session_; }
  const v1::AttachResponse& response() const { return response_; }
  ControlHeader* header() const { return header_; }
  RankHeader* me() const { return me_; }
  void* control_base() const { return control_.data(); }
  const ControlLayout& layout() const { return layout_; }
  char* memory() const { return static_cast<char*>(memory_.data()); }
  char* bucket(int b) const { return memory() + response_.buckets(b).offset(); }
  char* broadcast_area() const {
    return memory() + response_.broadcast_offset();
  }

  void Publish(int bucket, uint64_t iteration) {
    layout_.ready_row(control_.data(), rank_)[bucket].store(
        iteration, std::memory_order_release);
    RingDaemon(header_, me_, bell_.get());
  }
  uint64_t Done(int bucket) const {
    return layout_.done_seq(control_.data())[bucket].load(
        std::memory_order_acquire);
  }
  // True once every bucket is done for `iteration`; false on error/timeout.
  bool WaitAllDone(uint64_t iteration, std::chrono::milliseconds timeout =
                                           std::chrono::seconds(20)) {
    return WaitForDaemon(
        header_, me_,
        [&] {
          for (int b = 0; b < response_.buckets_size(); ++b) {
            if (Done(b) < iteration) return false;
          }
          return true;
        },
        std::chrono::microseconds(20), timeout);
  }
  void PublishBroadcast(uint64_t op, int root, uint64_t bytes) {
    BroadcastSlot* slot = layout_.bcast(control_.data(), rank_);
    slot->root.store(root, std::memory_order_relaxed);
    slot->bytes.store(bytes, std::memory_order_relaxed);
    slot->ready_seq.store(op, std::memory_order_release);
    RingDaemon(header_, me_, bell_.get());
  }
  // A collective round (control_block.h, version 4): the description, then
  // ready_seq.
  void PublishCollective(uint64_t op, int32_t kind, int32_t dtype,
                         int32_t reduce_op, uint64_t bytes) {
    BroadcastSlot* slot = layout_.bcast(control_.data(), rank_);
    slot->root.store(0, std::memory_order_relaxed);
    slot->bytes.store(bytes, std::memory_order_relaxed);
    slot->kind.store(kind, std::memory_order_relaxed);
    slot->dtype.store(dtype, std::memory_order_relaxed);
    slot->op.store(reduce_op, std::memory_order_relaxed);
    slot->ready_seq.store(op, std::memory_order_release);
    RingDaemon(header_, me_, bell_.get());
  }
  bool WaitBroadcast(uint64_t op, std::chrono::milliseconds timeout =
                                      std::chrono::seconds(20)) {
    return WaitForDaemon(
        header_, me_,
        [&] {
          return header_->bcast_done_seq.load(std::memory_order_acquire) >= op;
        },
        std::chrono::microseconds(20), timeout);
  }
  absl::Status Error() const { return ReadError(header_); }

 private:
  int rank_;
  uint64_t session_;
  v1::AttachResponse response_;
  ControlLayout layout_;
  ControlMapping control_;
  Mapping memory_;
  ControlHeader* header_ = nullptr;
  RankHeader* me_ = nullptr;
  UniqueFd bell_;
};

}  // namespace gradd

#endif  // GRADD_TESTS_UNIT_ENGINE_MANAGER_TEST_RANK_H_
