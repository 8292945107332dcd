// ProcessGroupGradd: a torch.distributed (c10d) process group whose
// collectives are run by the node's gradd daemon, so that
// dist.init_process_group("gradd"), dist.all_reduce and torch's own
// unmodified DistributedDataParallel work over gradd (gradd/distributed.py
// registers it as the backend "gradd").
//
// Owns one collective-only gradd::Client (a job of zero parameters with a
// shared collective area) and one worker thread. Every collective is
// checked and queued on the calling thread and returns at once a Work
// wrapping a c10::ivalue::Future; the worker runs the client's blocking
// calls one at a time in issue order (every rank issues the same sequence,
// as torch requires) and completes the future with the output tensors, or
// sets its error to a std::runtime_error carrying gradd's message (job,
// rank, reason). Future callbacks (DDP's reducer, comm hooks) run on the
// worker thread; they may queue further collectives.
//
// Tensors: CPU, one per call (no multi-device lists), float32/64, float16,
// bfloat16, int32/64, uint8, int8; a non-contiguous tensor is reduced in a
// contiguous copy that is copied back. Anything else throws c10::Error at
// the call (nothing is queued). Ranks are the group's ranks, which are the
// gradd job's global ranks (distributed.py places them so).
//
// Thread safety: the collectives may be called from any thread; calls
// from several threads at once are queued in the order they take the
// queue's lock. The worker never takes the GIL itself (only Python future
// callbacks do); the destructor releases it while it waits for the worker.
#ifndef GRADD_CLIENT_PYTHON_C10D_PROCESS_GROUP_GRADD_H_
#define GRADD_CLIENT_PYTHON_C10D_PROCESS_GROUP_GRADD_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "gradd/client.h"

namespace gradd::c10d_backend {

class ProcessGroupGradd : public c10d::ProcessGroup {
 public:
  // Takes an attached client; rank and size must be its global rank and
  // world size.
  ProcessGroupGradd(std::unique_ptr<gradd::Client> client, std::string job_id);
  ~ProcessGroupGradd() override;

  const std::string getBackendName() const override { return "gradd"; }
  const std::string& job_id() const { return job_id_; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts =
          c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& output_tensors,
      std::vector<at::Tensor>& input_tensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& output_tensors,
      std::vector<at::Tensor>& input_tensors,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& output_tensors,
      std::vector<std::vector<at::Tensor>>& input_tensors,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& output_tensors,
      std::vector<std::vector<at::Tensor>>& input_tensors,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

 private:
  // Runs on the worker: the client's blocking calls; returns the future's
  // value. A non-OK status becomes the future's error.
  using Body = std::function<absl::Status()>;

  // Queues `body`; the returned Work's future completes with `outputs`.
  c10::intrusive_ptr<c10d::Work> Enqueue(const char* what,
                                         std::vector<at::Tensor> outputs,
                                         Body body);
  void WorkerLoop();
  // Broadcast in chunks the client's broadcast area holds.
  absl::Status BroadcastBytes(void* data, size_t bytes, int root);

  std::unique_ptr<gradd::Client> client_;
  const std::string job_id_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  // Items the worker ran, dropped by the next caller (or the destructor)
  // rather than by the worker: their tensors may be the last references
  // to Python tensors, whose release needs the GIL, which the thread
  // waiting for the worker may hold.
  std::vector<std::function<void()>> done_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::thread worker_;
};

// The client's element type for a torch dtype; throws c10::Error naming
// `what` and the dtype for one gradd does not reduce.
int32_t GraddDtype(c10::ScalarType type, const char* what);

}  // namespace gradd::c10d_backend

#endif  // GRADD_CLIENT_PYTHON_C10D_PROCESS_GROUP_GRADD_H_
