// ProcessGroupGradd: a torch.distributed (c10d) backend whose collectives
// are run by the node's gradd daemon, so that
// dist.init_process_group("gradd"), dist.all_reduce and torch's own
// unmodified DistributedDataParallel work over gradd (gradd/distributed.py
// registers it as the backend "gradd"). On torch 1.13 it is a
// c10d::ProcessGroup, on torch 2.x a c10d::Backend that torch's own
// ProcessGroup routes CPU tensors to (torch_compat.h holds the
// differences).
//
// Owns one collective-only gradd::Client (a job of zero parameters with a
// shared collective area) and a small pool of threads. Every collective is
// checked and queued on the calling thread and returns at once a Work
// wrapping a c10::ivalue::Future.
//
// Threads (all named "gradd-pg"): one at a time holds the runner role and
// runs the client's blocking call of the oldest queued collective, so the
// collectives run one at a time in issue order (every rank issues the same
// sequence, as torch requires). Having run one, the thread gives the role
// up (waking an idle pool thread, or starting one when all are busy, if
// more collectives are queued) and then completes that collective's future
// itself: markCompleted with the output tensors, or setError with a
// std::runtime_error carrying gradd's message (job, rank, reason). Future
// callbacks (DDP's reducer, comm hooks) therefore run on a thread that is
// not needed to run the next collective: a callback may issue a collective
// of this group and wait for it (torch's PowerSGD and quantization hooks
// do), and the wait is served by another pool thread. Futures are completed
// strictly in issue order (a future's completed flag is set only after
// every earlier one's), while callbacks of an earlier future may still be
// running. A synchronous call costs no more thread hand-offs than one
// worker thread did: the thread that ran the collective completes it.
//
// The pool grows only while every thread is busy (running a collective or
// a future's callbacks, waiting for the GIL included), so its size is one
// more than the most callbacks that were ever running at once; idle
// threads stay until the group is destroyed. There is no cap: a cap would
// turn the (cap+1)-th blocked callback into a hang.
//
// Tensors: CPU, one per call (no multi-device lists), float32/64, float16,
// bfloat16, int32/64, uint8, int8; a non-contiguous tensor is reduced in a
// contiguous copy that is copied back. Anything else throws c10::Error at
// the call (nothing is queued), and so do the operations gradd does not run
// (point-to-point send/recv, all_to_all), naming the operation. A coalesced
// call (allreduce_coalesced, allgather_coalesced, and torch 2.x's
// allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced) is one
// queued item: its parts run back to back and complete one future. Ranks are
// the group's ranks, which are the gradd job's global ranks (distributed.py
// places them so).
//
// Thread safety: the collectives may be called from any thread, future
// callbacks included; calls from several threads at once are queued in the
// order they take the queue's lock. Pool threads never take the GIL
// themselves (only Python future callbacks do).
//
// Destruction: the destructor (GIL released while it waits) lets the pool
// run every queued collective and complete its future, joins the threads
// and detaches the client. Destroyed on one of its own threads (a future
// callback dropped the last reference), it cannot wait for itself: its
// threads are detached, finish the queue on their own and the last one
// out drops the shared state (client included). At interpreter exit
// (Python threads can no longer take the GIL) it waits for nothing and
// leaves the state to the process's end. The threads share that state
// with the group (State), so none touches freed memory in any case.
#ifndef GRADD_CLIENT_PYTHON_C10D_PROCESS_GROUP_GRADD_H_
#define GRADD_CLIENT_PYTHON_C10D_PROCESS_GROUP_GRADD_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradd/client.h"
#include "torch_compat.h"

namespace gradd::c10d_backend {

class ProcessGroupGradd : public compat::BackendBase {
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

  // Coalesced: the i-th output / input pair is one call of the single
  // version; all of them are one item (one future).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists,
      std::vector<at::Tensor>& input_tensors,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions())
      GRADD_TORCH2_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions())
      GRADD_TORCH2_OVERRIDE;

  // Not run by gradd: each throws c10::Error naming the operation.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& output_tensors,
      std::vector<at::Tensor>& input_tensors,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;

 private:
  // Runs on a pool thread holding the runner role: the client's blocking
  // calls. A non-OK status becomes the future's error.
  using Body = std::function<absl::Status()>;
  struct Item;
  struct State;

  // Queues `body`; the returned Work's future completes with `outputs`.
  c10::intrusive_ptr<c10d::Work> Enqueue(const char* what,
                                         std::vector<at::Tensor> outputs,
                                         Body body);

  // Shared with the pool threads; null only once destroyed.
  std::shared_ptr<State> state_;
  // The client (owned by state_), for the bodies to capture: they may run
  // after this object is gone (see Destruction above).
  gradd::Client* const client_;
  const std::string job_id_;
};

// The client's element type for a torch dtype; throws c10::Error naming
// `what` and the dtype for one gradd does not reduce.
int32_t GraddDtype(c10::ScalarType type, const char* what);

}  // namespace gradd::c10d_backend

#endif  // GRADD_CLIENT_PYTHON_C10D_PROCESS_GROUP_GRADD_H_
