#include "process_group_gradd.h"

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
#include "collective_args.h"

namespace gradd::c10d_backend {

int32_t GraddDtype(c10::ScalarType type, const char* what) {
  switch (type) {
    case c10::kFloat:
      return gradd::dtype::kFloat32;
    case c10::kDouble:
      return gradd::dtype::kFloat64;
    case c10::kHalf:
      return gradd::dtype::kFloat16;
    case c10::kBFloat16:
      return gradd::dtype::kBFloat16;
    case c10::kInt:
      return gradd::dtype::kInt32;
    case c10::kLong:
      return gradd::dtype::kInt64;
    case c10::kByte:
      return gradd::dtype::kUInt8;
    case c10::kChar:
      return gradd::dtype::kInt8;
    default:
      TORCH_CHECK(false, "gradd backend: ", what, " does not support dtype ",
                  type,
                  " (supported: float32, float64, float16, bfloat16, int32, "
                  "int64, uint8, int8)");
  }
}

// One queued collective.
struct ProcessGroupGradd::Item {
  const char* what;
  uint64_t seq;  // issue number
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::vector<at::Tensor> outputs;
  Body body;
};

// What the pool threads share with the group (see the header's Threads and
// Destruction). Every field but `client` is guarded by `mu`; `client` is
// used by the runner-role holder only (and destroyed with the state).
struct ProcessGroupGradd::State {
  explicit State(std::unique_ptr<gradd::Client> c) : client(std::move(c)) {}

  // Starts one more pool thread (mu held). Failing to (the process is out
  // of threads) is reported; the queue then waits for a busy thread.
  static void Spawn(const std::shared_ptr<State>& s) {
    try {
      std::thread t([s] { Main(s); });
      // Named here rather than by the thread, so that it is named by the
      // time the constructor (or collective) that started it returns.
      pthread_setname_np(t.native_handle(), "gradd-pg");
      ++s->live;
      if (s->detached) {
        t.detach();
      } else {
        s->threads.push_back(std::move(t));
      }
    } catch (const std::system_error& e) {
      std::fprintf(stderr,
                   "gradd backend: cannot start a thread for the process "
                   "group (%s); queued collectives wait for a busy one\n",
                   e.what());
    }
  }

  // Hands the oldest queued collective to a thread (mu held, the runner
  // role free): starts one when none is idle; returns whether the caller
  // must wake an idle one (work_cv.notify_one once it released mu, so that
  // the woken thread does not wait for the mutex).
  [[nodiscard]] static bool Dispatch(const std::shared_ptr<State>& s) {
    if (s->idle > 0) return true;
    Spawn(s);
    return false;
  }

  static void Main(std::shared_ptr<State> s) {
    std::unique_lock<std::mutex> lock(s->mu);
    for (;;) {
      ++s->idle;
      s->work_cv.wait(lock, [&] {
        return (!s->running && !s->queue.empty()) ||
               (s->stopping && s->queue.empty());
      });
      --s->idle;
      if (s->queue.empty()) break;
      std::unique_ptr<Item> item = std::move(s->queue.front());
      s->queue.pop_front();
      s->running = true;
      // Idle threads of a stopping group end once the queue is empty.
      if (s->stopping && s->queue.empty()) s->work_cv.notify_all();
      lock.unlock();

      absl::Status status;
      try {
        status = item->body();
      } catch (...) {
        status = FromException(item->what);
      }

      lock.lock();
      s->running = false;
      // The next collective goes to another thread: this one's future
      // callbacks may wait for it.
      if (!s->queue.empty() && Dispatch(s)) {
        lock.unlock();
        s->work_cv.notify_one();
        lock.lock();
      }
      // Futures complete in issue order; the previous one's thread is
      // about to set its flag (nothing user-defined runs before that).
      s->turn_cv.wait(lock, [&] { return s->next_mark == item->seq; });
      lock.unlock();
      Complete(*item, status);
      lock.lock();
      // Normally advanced by the future's first callback (Enqueue).
      if (s->next_mark == item->seq) {
        s->next_mark = item->seq + 1;
        s->turn_cv.notify_all();
      }
      // Dropped by the next caller or the destructor: the tensors may be
      // the last references to Python tensors, whose release takes the
      // GIL, which a thread waiting for this one may hold.
      s->done.push_back(std::move(item));
    }
    --s->live;
    s->exit_cv.notify_all();
  }

  // Completes the item's future, running its callbacks here; nothing they
  // throw leaves the thread.
  static void Complete(Item& item, const absl::Status& status) {
    try {
      if (status.ok()) {
        item.future->markCompleted(c10::IValue(item.outputs));
      } else {
        item.future->setError(
            std::make_exception_ptr(std::runtime_error(absl::StrCat(
                "gradd ", item.what, " failed: ", status.ToString()))));
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "gradd backend: a callback of the %s future threw: %s\n",
                   item.what, e.what());
    } catch (...) {
      std::fprintf(stderr, "gradd backend: a callback of the %s future threw\n",
                   item.what);
    }
  }

  std::unique_ptr<gradd::Client> client;

  std::mutex mu;
  std::condition_variable work_cv;          // a collective to run, or stopping
  std::condition_variable turn_cv;          // next_mark advanced
  std::condition_variable exit_cv;          // live dropped
  std::deque<std::unique_ptr<Item>> queue;  // issued, not yet started
  uint64_t next_seq = 0;                    // of the next Enqueue
  uint64_t next_mark = 0;  // seq of the next future to complete
  bool running = false;    // a thread holds the runner role
  int idle = 0;            // threads waiting for a collective to run
  int live = 0;            // threads started and not yet ended
  bool stopping = false;
  bool detached = false;  // threads are detached, not joined
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Item>> done;  // see Main
};

ProcessGroupGradd::ProcessGroupGradd(std::unique_ptr<gradd::Client> client,
                                     std::string job_id)
    : compat::BackendBase(client->global_rank(), client->world_size()),
      state_(std::make_shared<State>(std::move(client))),
      client_(state_->client.get()),
      job_id_(std::move(job_id)) {
  std::lock_guard<std::mutex> lock(state_->mu);
  State::Spawn(state_);
}

ProcessGroupGradd::~ProcessGroupGradd() {
  std::shared_ptr<State> s = std::move(state_);
  std::unique_lock<std::mutex> lock(s->mu);
  s->stopping = true;
  s->work_cv.notify_all();
  const bool finalizing = Py_IsInitialized() && compat::PythonFinalizing();
  const bool on_own_thread = std::any_of(
      s->threads.begin(), s->threads.end(),
      [](std::thread& t) { return t.get_id() == std::this_thread::get_id(); });
  if (finalizing || on_own_thread) {
    // Cannot wait: at interpreter exit Python threads can no longer take
    // the GIL, so queued work whose callbacks need it would never finish;
    // on one of the group's threads, this thread's own callbacks (and
    // others waiting for them) come after this destructor. The threads
    // finish on their own; the last drops the state.
    for (std::thread& t : s->threads) t.detach();
    s->threads.clear();
    s->detached = true;
    if (finalizing) {
      // Never dropped: its release (client detach, tensors) would need
      // the GIL; the daemon sees the process go.
      new std::shared_ptr<State>(s);
    }
    return;
  }
  // The threads run what was queued (each call is bounded by the client's
  // wait_timeout) and complete the futures, whose callbacks may need the
  // GIL, which a Python caller of the destructor holds.
  lock.unlock();
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
  lock.lock();
  s->exit_cv.wait(lock, [&] { return s->live == 0; });
  std::vector<std::thread> threads = std::move(s->threads);
  lock.unlock();
  for (std::thread& t : threads) t.join();
  s->client.reset();  // detaches
  if (saved != nullptr) PyEval_RestoreThread(saved);
  // `s` (the done items' tensors) is dropped here, with the GIL.
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::Enqueue(
    const char* what, std::vector<at::Tensor> outputs, Body body) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()));
  auto work = c10::make_intrusive<GraddWork>(rank_, future, outputs);
  auto item = std::make_unique<Item>(
      Item{what, 0, future, std::move(outputs), std::move(body)});
  std::vector<std::unique_ptr<Item>> done;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    item->seq = state_->next_seq++;
    // The first callback, so it runs as soon as the future's flag is set
    // and before any callback of the caller's: the next future may be
    // completed from then on. Runs on a pool thread, which keeps the
    // state alive.
    State* s = state_.get();
    const uint64_t seq = item->seq;
    future->addCallback([s, seq](c10::ivalue::Future&) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->next_mark = seq + 1;
      }
      s->turn_cv.notify_all();
    });
    state_->queue.push_back(std::move(item));
    wake = !state_->running && State::Dispatch(state_);
    done.swap(state_->done);
  }
  if (wake) state_->work_cv.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor& t = Single(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "gradd backend: broadcast root ", opts.rootRank,
              " is not a rank of the group (size ", size_, ")");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  return Enqueue(
      "broadcast", tensors, [client = client_, t, buf, root]() mutable {
        if (absl::Status s =
                BroadcastBytes(client, buf.data_ptr(), buf.nbytes(), root);
            !s.ok()) {
          return s;
        }
        if (!buf.is_same(t)) t.copy_(buf);
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor& t = Single(tensors, "allreduce");
  const int32_t dtype = GraddDtype(t.scalar_type(), "allreduce");
  const gradd::ReduceOp op = GraddOp(opts.reduceOp, "allreduce");
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  return Enqueue(
      "allreduce", tensors, [client = client_, t, buf, dtype, op]() mutable {
        if (absl::Status s = client->Allreduce(
                buf.data_ptr(), static_cast<size_t>(buf.numel()), dtype, op);
            !s.ok()) {
          return s;
        }
        if (!buf.is_same(t)) t.copy_(buf);
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(),
              "gradd backend: allreduce_coalesced needs at least one tensor");
  for (const at::Tensor& t : tensors) {
    CheckTensor(t, "allreduce_coalesced");
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "gradd backend: allreduce_coalesced needs tensors of one "
                "dtype, got ",
                tensors[0].scalar_type(), " and ", t.scalar_type());
  }
  const int32_t dtype =
      GraddDtype(tensors[0].scalar_type(), "allreduce_coalesced");
  const gradd::ReduceOp op = GraddOp(opts.reduceOp, "allreduce_coalesced");
  return Enqueue(
      "allreduce_coalesced", tensors,
      [client = client_, tensors, dtype, op]() mutable {
        std::vector<at::Tensor> flat_parts;
        flat_parts.reserve(tensors.size());
        for (const at::Tensor& t : tensors) flat_parts.push_back(t.reshape(-1));
        at::Tensor flat = at::cat(flat_parts);
        if (absl::Status s = client->Allreduce(
                flat.data_ptr(), static_cast<size_t>(flat.numel()), dtype, op);
            !s.ok()) {
          return s;
        }
        int64_t off = 0;
        for (at::Tensor& t : tensors) {
          t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
          off += t.numel();
        }
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor& t = Single(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "gradd backend: reduce root ", opts.rootRank,
              " is not a rank of the group (size ", size_, ")");
  const int32_t dtype = GraddDtype(t.scalar_type(), "reduce");
  const gradd::ReduceOp op = GraddOp(opts.reduceOp, "reduce");
  const bool is_root = opts.rootRank == rank_;
  // An allreduce; only the root's tensor receives the result.
  at::Tensor buf = (is_root && t.is_contiguous()) ? t : t.contiguous().clone();
  return Enqueue(
      "reduce", tensors,
      [client = client_, t, buf, dtype, op, is_root]() mutable {
        if (absl::Status s = client->Allreduce(
                buf.data_ptr(), static_cast<size_t>(buf.numel()), dtype, op);
            !s.ok()) {
          return s;
        }
        if (is_root && !buf.is_same(t)) t.copy_(buf);
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::allgather(
    std::vector<std::vector<at::Tensor>>& output_tensors,
    std::vector<at::Tensor>& input_tensors, const c10d::AllgatherOptions&) {
  at::Tensor& in = Single(input_tensors, "allgather");
  TORCH_CHECK(output_tensors.size() == 1,
              "gradd backend: allgather takes one output list per process");
  std::vector<at::Tensor>& outs = output_tensors[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == size_,
              "gradd backend: allgather needs ", size_,
              " output tensors (the group size), got ", outs.size());
  for (const at::Tensor& o : outs) {
    CheckTensor(o, "allgather");
    TORCH_CHECK(o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
                "gradd backend: allgather output tensors must match the "
                "input's size and dtype (",
                in.numel(), " x ", in.scalar_type(), "), got ", o.numel(),
                " x ", o.scalar_type());
  }
  at::Tensor src = in.contiguous();
  return Enqueue(
      "allgather", outs, [client = client_, size = size_, src, outs]() mutable {
        at::Tensor all = at::empty({size, src.numel()}, src.options());
        if (absl::Status s =
                client->Allgather(src.data_ptr(), src.nbytes(), all.data_ptr());
            !s.ok()) {
          return s;
        }
        for (int r = 0; r < size; ++r) {
          outs[r].copy_(all[r].view(outs[r].sizes()));
        }
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  IntoTensor p = MakeAllgatherInto(output, input, size_, "_allgather_base");
  return Enqueue("_allgather_base", {output}, [client = client_, p]() mutable {
    return AllgatherInto(client, p);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists,
    std::vector<at::Tensor>& input_tensors, const c10d::AllgatherOptions&) {
  // output_lists[r][i] receives rank r's input_tensors[i] (torch's and
  // Gloo's layout).
  const char* what = "allgather_coalesced";
  TORCH_CHECK(!input_tensors.empty(), "gradd backend: ", what,
              " needs at least one tensor");
  TORCH_CHECK(static_cast<int>(output_lists.size()) == size_,
              "gradd backend: ", what, " needs ", size_,
              " output lists (the group size), got ", output_lists.size());
  std::vector<at::Tensor> srcs;
  for (const at::Tensor& in : input_tensors) {
    CheckTensor(in, what);
    srcs.push_back(in.contiguous());
  }
  std::vector<at::Tensor> all_outs;  // rank-major, as output_lists
  for (const std::vector<at::Tensor>& list : output_lists) {
    TORCH_CHECK(list.size() == input_tensors.size(), "gradd backend: ", what,
                " needs one output per input (", input_tensors.size(),
                ") in every output list, got ", list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const at::Tensor& o = list[i];
      const at::Tensor& in = input_tensors[i];
      CheckTensor(o, what);
      TORCH_CHECK(
          o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
          "gradd backend: ", what,
          " output tensors must match their input's size and dtype (",
          in.numel(), " x ", in.scalar_type(), "), got ", o.numel(), " x ",
          o.scalar_type());
      all_outs.push_back(o);
    }
  }
  return Enqueue(
      what, all_outs,
      [client = client_, size = size_, srcs, all_outs]() mutable {
        const size_t n = srcs.size();
        for (size_t i = 0; i < n; ++i) {
          const at::Tensor& src = srcs[i];
          at::Tensor all = at::empty({size, src.numel()}, src.options());
          if (absl::Status s = client->Allgather(src.data_ptr(), src.nbytes(),
                                                 all.data_ptr());
              !s.ok()) {
            return s;
          }
          for (int r = 0; r < size; ++r) {
            at::Tensor& o = all_outs[r * n + i];
            o.copy_(all[r].view(o.sizes()));
          }
        }
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupGradd::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  const char* what = "allgather_into_tensor_coalesced";
  CheckPairs(outputs, inputs, what);
  std::vector<IntoTensor> pairs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    pairs.push_back(MakeAllgatherInto(outputs[i], inputs[i], size_, what));
  }
  return Enqueue(what, outputs, [client = client_, pairs]() mutable {
    for (IntoTensor& p : pairs) {
      if (absl::Status s = AllgatherInto(client, p); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::gather(
    std::vector<std::vector<at::Tensor>>& output_tensors,
    std::vector<at::Tensor>& input_tensors, const c10d::GatherOptions& opts) {
  at::Tensor& in = Single(input_tensors, "gather");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "gradd backend: gather root ", opts.rootRank,
              " is not a rank of the group (size ", size_, ")");
  const bool is_root = opts.rootRank == rank_;
  std::vector<at::Tensor> outs;
  if (is_root) {
    TORCH_CHECK(output_tensors.size() == 1 &&
                    static_cast<int>(output_tensors[0].size()) == size_,
                "gradd backend: gather needs one list of ", size_,
                " output tensors on the root");
    outs = output_tensors[0];
    for (const at::Tensor& o : outs) {
      CheckTensor(o, "gather");
      TORCH_CHECK(
          o.numel() == in.numel() && o.scalar_type() == in.scalar_type(),
          "gradd backend: gather output tensors must match the input");
    }
  } else {
    TORCH_CHECK(output_tensors.empty() ||
                    (output_tensors.size() == 1 && output_tensors[0].empty()),
                "gradd backend: gather takes output tensors on the root only");
  }
  // An allgather; only the root keeps the blocks.
  at::Tensor src = in.contiguous();
  return Enqueue(
      "gather", outs,
      [client = client_, size = size_, src, outs, is_root]() mutable {
        at::Tensor all = at::empty({size, src.numel()}, src.options());
        if (absl::Status s =
                client->Allgather(src.data_ptr(), src.nbytes(), all.data_ptr());
            !s.ok()) {
          return s;
        }
        if (is_root) {
          for (int r = 0; r < size; ++r) {
            outs[r].copy_(all[r].view(outs[r].sizes()));
          }
        }
        return absl::OkStatus();
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::scatter(
    std::vector<at::Tensor>& output_tensors,
    std::vector<std::vector<at::Tensor>>& input_tensors,
    const c10d::ScatterOptions& opts) {
  at::Tensor& out = Single(output_tensors, "scatter");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_,
              "gradd backend: scatter root ", opts.rootRank,
              " is not a rank of the group (size ", size_, ")");
  const int root = static_cast<int>(opts.rootRank);
  // A broadcast of every block from the root; each rank keeps its own.
  at::Tensor all = at::empty({size_, out.numel()}, out.options());
  if (root == rank_) {
    TORCH_CHECK(input_tensors.size() == 1 &&
                    static_cast<int>(input_tensors[0].size()) == size_,
                "gradd backend: scatter needs one list of ", size_,
                " input tensors on the root");
    for (int r = 0; r < size_; ++r) {
      const at::Tensor& i = input_tensors[0][r];
      CheckTensor(i, "scatter");
      TORCH_CHECK(
          i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
          "gradd backend: scatter input tensors must match the output");
      all[r].copy_(i.reshape(-1));
    }
  } else {
    TORCH_CHECK(input_tensors.empty() ||
                    (input_tensors.size() == 1 && input_tensors[0].empty()),
                "gradd backend: scatter takes input tensors on the root only");
  }
  return Enqueue("scatter", output_tensors,
                 [client = client_, rank = rank_, all, out, root]() mutable {
                   if (absl::Status s = BroadcastBytes(client, all.data_ptr(),
                                                       all.nbytes(), root);
                       !s.ok()) {
                     return s;
                   }
                   out.copy_(all[rank].view(out.sizes()));
                   return absl::OkStatus();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::reduce_scatter(
    std::vector<at::Tensor>& output_tensors,
    std::vector<std::vector<at::Tensor>>& input_tensors,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = Single(output_tensors, "reduce_scatter");
  TORCH_CHECK(input_tensors.size() == 1 &&
                  static_cast<int>(input_tensors[0].size()) == size_,
              "gradd backend: reduce_scatter needs one list of ", size_,
              " input tensors (the group size)");
  for (const at::Tensor& i : input_tensors[0]) {
    CheckTensor(i, "reduce_scatter");
    TORCH_CHECK(
        i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
        "gradd backend: reduce_scatter input tensors must match the "
        "output's size and dtype (",
        out.numel(), " x ", out.scalar_type(), "), got ", i.numel(), " x ",
        i.scalar_type());
  }
  const int32_t dtype = GraddDtype(out.scalar_type(), "reduce_scatter");
  const gradd::ReduceOp op = GraddOp(opts.reduceOp, "reduce_scatter");
  std::vector<at::Tensor> parts;
  for (const at::Tensor& i : input_tensors[0]) parts.push_back(i.reshape(-1));
  at::Tensor flat = at::cat(parts);
  at::Tensor dst = out.is_contiguous() ? out : out.contiguous();
  return Enqueue("reduce_scatter", output_tensors,
                 [client = client_, flat, dst, out, dtype, op]() mutable {
                   if (absl::Status s = client->ReduceScatter(
                           flat.data_ptr(), dst.data_ptr(),
                           static_cast<size_t>(dst.numel()), dtype, op);
                       !s.ok()) {
                     return s;
                   }
                   if (!dst.is_same(out)) out.copy_(dst);
                   return absl::OkStatus();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  const char* what = "_reduce_scatter_base";
  IntoTensor p = MakeReduceScatterInto(output, input, size_, what);
  const gradd::ReduceOp op = GraddOp(opts.reduceOp, what);
  return Enqueue(what, {output}, [client = client_, p, op]() mutable {
    return ReduceScatterInto(client, p, op);
  });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupGradd::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter_tensor_coalesced";
  CheckPairs(outputs, inputs, what);
  std::vector<IntoTensor> pairs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    pairs.push_back(MakeReduceScatterInto(outputs[i], inputs[i], size_, what));
  }
  const gradd::ReduceOp op = GraddOp(opts.reduceOp, what);
  return Enqueue(what, outputs, [client = client_, pairs, op]() mutable {
    for (IntoTensor& p : pairs) {
      if (absl::Status s = ReduceScatterInto(client, p, op); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::barrier(
    const c10d::BarrierOptions&) {
  return Enqueue("barrier", {},
                 [client = client_] { return client->Barrier(); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::send(std::vector<at::Tensor>&,
                                                       int, int) {
  Unsupported("send (point-to-point)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::recv(std::vector<at::Tensor>&,
                                                       int, int) {
  Unsupported("recv (point-to-point)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::recvAnysource(
    std::vector<at::Tensor>&, int) {
  Unsupported("recv from any source (point-to-point)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::alltoall_base(
    at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
    const c10d::AllToAllOptions&) {
  Unsupported("all_to_all_single (alltoall_base)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupGradd::alltoall(
    std::vector<at::Tensor>&, std::vector<at::Tensor>&,
    const c10d::AllToAllOptions&) {
  Unsupported("all_to_all (alltoall)");
}

}  // namespace gradd::c10d_backend
