#include "collective_args.h"

#include <ATen/ATen.h>
#include <Python.h>
#include <c10/util/Exception.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd::c10d_backend {

gradd::ReduceOp GraddOp(const c10d::ReduceOp& op, const char* what) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
      return gradd::ReduceOp::kSum;
    case c10d::ReduceOp::AVG:
      return gradd::ReduceOp::kAvg;
    case c10d::ReduceOp::MIN:
      return gradd::ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return gradd::ReduceOp::kMax;
    default:
      TORCH_CHECK(false, "gradd backend: ", what,
                  " supports ReduceOp SUM, AVG, MIN and MAX, not ReduceOp ",
                  static_cast<int>(op.op_));
  }
}

void CheckTensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "gradd backend: ", what, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "gradd backend: ", what,
              " supports CPU tensors only, got a tensor on ", t.device());
  TORCH_CHECK(t.layout() == c10::kStrided, "gradd backend: ", what,
              " supports dense tensors only, got layout ", t.layout());
  GraddDtype(t.scalar_type(), what);
}

// The single tensor of a one-tensor-per-process call.
at::Tensor& Single(std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "gradd backend: ", what,
              " takes one tensor per process, got ", tensors.size());
  CheckTensor(tensors[0], what);
  return tensors[0];
}

// Broadcast in chunks the client's broadcast area holds.
absl::Status BroadcastBytes(gradd::Client* client, void* data, size_t bytes,
                            int root) {
  auto* p = static_cast<char*>(data);
  for (size_t off = 0; off < bytes; off += kBroadcastChunk) {
    const size_t n = std::min(kBroadcastChunk, bytes - off);
    if (absl::Status s = client->Broadcast(p + off, n, root); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

IntoTensor MakeInto(at::Tensor& output, at::Tensor& input, const char* what) {
  return IntoTensor{input.contiguous(),
                    output.is_contiguous() ? output : output.contiguous(),
                    output, GraddDtype(output.scalar_type(), what)};
}

// `whole` (the collective's `whole_name`: "output" or "input") must hold
// group size x `part`'s elements, of `part`'s type.
void CheckHoldsGroup(const at::Tensor& whole, const at::Tensor& part, int size,
                     const char* what, const char* whole_name) {
  CheckTensor(whole, what);
  CheckTensor(part, what);
  TORCH_CHECK(whole.scalar_type() == part.scalar_type() &&
                  whole.numel() == part.numel() * size,
              "gradd backend: ", what, " ", whole_name,
              " must hold group size (", size, ") x ", part.numel(),
              " elements of ", part.scalar_type(), ", got ", whole.numel(),
              " x ", whole.scalar_type());
}

// The output holds `size` inputs.
IntoTensor MakeAllgatherInto(at::Tensor& output, at::Tensor& input, int size,
                             const char* what) {
  CheckHoldsGroup(output, input, size, what, "output");
  return MakeInto(output, input, what);
}

// The input holds `size` outputs.
IntoTensor MakeReduceScatterInto(at::Tensor& output, at::Tensor& input,
                                 int size, const char* what) {
  CheckHoldsGroup(input, output, size, what, "input");
  return MakeInto(output, input, what);
}

void CheckPairs(const std::vector<at::Tensor>& outputs,
                const std::vector<at::Tensor>& inputs, const char* what) {
  TORCH_CHECK(!inputs.empty(), "gradd backend: ", what,
              " needs at least one tensor");
  TORCH_CHECK(outputs.size() == inputs.size(), "gradd backend: ", what,
              " needs one output per input, got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
}

absl::Status AllgatherInto(gradd::Client* client, IntoTensor& p) {
  if (absl::Status s =
          client->Allgather(p.src.data_ptr(), p.src.nbytes(), p.dst.data_ptr());
      !s.ok()) {
    return s;
  }
  if (!p.dst.is_same(p.output)) p.output.copy_(p.dst);
  return absl::OkStatus();
}

absl::Status ReduceScatterInto(gradd::Client* client, IntoTensor& p,
                               gradd::ReduceOp op) {
  if (absl::Status s = client->ReduceScatter(p.src.data_ptr(), p.dst.data_ptr(),
                                             static_cast<size_t>(p.dst.numel()),
                                             p.dtype, op);
      !s.ok()) {
    return s;
  }
  if (!p.dst.is_same(p.output)) p.output.copy_(p.dst);
  return absl::OkStatus();
}

[[noreturn]] void Unsupported(const char* what) {
  TORCH_CHECK(false, "gradd backend: ", what,
              " is not supported; gradd runs all_reduce, broadcast, "
              "all_gather, reduce_scatter, reduce, gather, scatter and "
              "barrier (use a Gloo group for the others)");
}

absl::Status FromException(const char* what) {
  try {
    throw;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace gradd::c10d_backend
