// The argument checks and helpers of the "gradd" c10d backend
// (process_group_gradd.cc): the Work it returns, torch's reduce ops and
// dtypes as gradd's, the tensor checks and the chunked/_into_tensor
// collectives over a gradd::Client.
#ifndef GRADD_CLIENT_PYTHON_C10D_COLLECTIVE_ARGS_H_
#define GRADD_CLIENT_PYTHON_C10D_COLLECTIVE_ARGS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "process_group_gradd.h"

namespace gradd::c10d_backend {

// Broadcast moves at most this many bytes per client call (the client's
// broadcast area is attached with this size, see module.cc).
constexpr size_t kBroadcastChunk = size_t{4} << 20;

// A Work over a future that the worker completes. Unlike
// c10d::Work::create_from_future's, wait() rethrows the collective's error
// and result() returns the output tensors.
class GraddWork : public c10d::Work {
 public:
  GraddWork(int rank, c10::intrusive_ptr<c10::ivalue::Future> future,
            std::vector<at::Tensor> outputs)
      : c10d::Work(rank),
        future_(std::move(future)),
        outputs_(std::move(outputs)) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override {
    return future_->completed() && !future_->hasError();
  }
  std::exception_ptr exception() const override {
    return future_->completed() ? future_->exception_ptr() : nullptr;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}

  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout) {
      future_->wait();
    } else {
      // ivalue::Future has no timed wait; poll with a short back-off.
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      auto pause = std::chrono::microseconds(50);
      while (!future_->completed()) {
        TORCH_CHECK(std::chrono::steady_clock::now() < deadline,
                    "gradd: collective did not complete within ",
                    timeout.count(), " ms");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(10000));
      }
    }
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }

 private:
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
  const std::vector<at::Tensor> outputs_;
};

gradd::ReduceOp GraddOp(const c10d::ReduceOp& op, const char* what);

void CheckTensor(const at::Tensor& t, const char* what);

// The single tensor of a one-tensor-per-process call.
at::Tensor& Single(std::vector<at::Tensor>& tensors, const char* what);

// Broadcast in chunks the client's broadcast area holds.
absl::Status BroadcastBytes(gradd::Client* client, void* data, size_t bytes,
                            int root);

// One output / input pair of an _into_tensor collective: the contiguous
// input, the contiguous buffer the result lands in, and the output (when
// the buffer is a copy, the result is copied into it).
struct IntoTensor {
  at::Tensor src;
  at::Tensor dst;
  at::Tensor output;
  int32_t dtype;
};

IntoTensor MakeInto(at::Tensor& output, at::Tensor& input, const char* what);

// `whole` (the collective's `whole_name`: "output" or "input") must hold
// group size x `part`'s elements, of `part`'s type.
void CheckHoldsGroup(const at::Tensor& whole, const at::Tensor& part, int size,
                     const char* what, const char* whole_name);

// The output holds `size` inputs.
IntoTensor MakeAllgatherInto(at::Tensor& output, at::Tensor& input, int size,
                             const char* what);

// The input holds `size` outputs.
IntoTensor MakeReduceScatterInto(at::Tensor& output, at::Tensor& input,
                                 int size, const char* what);

void CheckPairs(const std::vector<at::Tensor>& outputs,
                const std::vector<at::Tensor>& inputs, const char* what);

absl::Status AllgatherInto(gradd::Client* client, IntoTensor& p);

absl::Status ReduceScatterInto(gradd::Client* client, IntoTensor& p,
                               gradd::ReduceOp op);

[[noreturn]] void Unsupported(const char* what);

absl::Status FromException(const char* what);

}  // namespace gradd::c10d_backend

#endif  // GRADD_CLIENT_PYTHON_C10D_COLLECTIVE_ARGS_H_
