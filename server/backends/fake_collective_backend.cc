#include "server/backends/fake_collective_backend.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/reduce.h"

namespace gradd {
namespace {

constexpr int kAllreduce = 1;
constexpr int kBroadcast = 2;
constexpr int kCombine = 3;

const char* KindName(int kind) {
  return kind == kAllreduce ? "AllreduceSum"
         : kind == kCombine ? "AllreduceWith"
                            : "Broadcast";
}

template <typename T>
void SumAll(const std::vector<void*>& data, size_t count) {
  // Node-rank order, in T: deterministic and the same on every node.
  std::vector<T> sum(static_cast<const T*>(data[0]),
                     static_cast<const T*>(data[0]) + count);
  for (size_t r = 1; r < data.size(); ++r) {
    const T* in = static_cast<const T*>(data[r]);
    for (size_t i = 0; i < count; ++i) sum[i] += in[i];
  }
  for (void* out : data) std::memcpy(out, sum.data(), count * sizeof(T));
}

// 16-bit wire types: each addition in float32, rounded back (as Gloo).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void SumAll16(const std::vector<void*>& data, size_t count) {
  std::vector<uint16_t> sum(static_cast<const uint16_t*>(data[0]),
                            static_cast<const uint16_t*>(data[0]) + count);
  for (size_t r = 1; r < data.size(); ++r) {
    const uint16_t* in = static_cast<const uint16_t*>(data[r]);
    for (size_t i = 0; i < count; ++i) {
      sum[i] = FromFloat(ToFloat(sum[i]) + ToFloat(in[i]));
    }
  }
  for (void* out : data) std::memcpy(out, sum.data(), count * 2);
}

}  // namespace

class FakeCollectiveBackend::Group {
 public:
  Group(int num_nodes, absl::Duration timeout, std::vector<std::string> names)
      : num_nodes_(num_nodes),
        timeout_(timeout),
        names_(std::move(names)),
        gone_(num_nodes, false) {
    names_.resize(num_nodes);
    for (int r = 0; r < num_nodes; ++r) {
      if (names_[r].empty()) names_[r] = absl::StrCat("fake-node-", r);
    }
  }

  int num_nodes() const { return num_nodes_; }
  std::string Name(int r) const {
    if (r < 0 || r >= num_nodes_) return absl::StrCat("node rank ", r);
    return absl::StrCat("'", names_[r], "' (node rank ", r, ")");
  }

  void Leave(int rank) {
    absl::MutexLock lock(&mu_);
    gone_[rank] = true;
    changed_.SignalAll();
  }

  absl::Status Run(int rank, uint64_t seq, int kind, void* data, size_t count,
                   DType dtype, int root, size_t elem = 0,
                   CombineFn combine = nullptr) {
    absl::MutexLock lock(&mu_);
    Op& op = ops_[seq];
    if (op.data.empty()) {
      op.data.assign(num_nodes_, nullptr);
      op.kind = kind;
      op.count = count;
      op.dtype = dtype;
      op.root = root;
      op.elem = elem;
      op.combine = combine;
      op.first = rank;
    } else if (!op.done &&
               (op.kind != kind || op.count != count || op.dtype != dtype ||
                op.root != root || op.elem != elem || op.combine != combine)) {
      op.result = absl::InvalidArgumentError(absl::StrCat(
          "mismatched collective #", seq, ": node ", Name(op.first), " called ",
          KindName(op.kind), "(count ", op.count, ", root ", op.root,
          ") but node ", Name(rank), " called ", KindName(kind), "(count ",
          count, ", root ", root, ")"));
      op.done = true;
      changed_.SignalAll();
    }
    op.data[rank] = data;
    ++op.arrived;
    if (!op.done && op.arrived == num_nodes_) {
      if (kind == kCombine) {
        // Node-rank order, like the sums.
        for (int r = 1; r < num_nodes_; ++r) {
          combine(op.data[0], op.data[0], op.data[r], count);
        }
        for (int r = 1; r < num_nodes_; ++r) {
          std::memcpy(op.data[r], op.data[0], count * elem);
        }
      } else if (kind == kAllreduce) {
        if (dtype == DType::kFloat64) {
          SumAll<double>(op.data, count);
        } else if (dtype == DType::kFloat16) {
          SumAll16<&HalfToFloat, &FloatToHalf>(op.data, count);
        } else if (dtype == DType::kBFloat16) {
          SumAll16<&BFloat16ToFloat, &FloatToBFloat16>(op.data, count);
        } else {
          SumAll<float>(op.data, count);
        }
      } else {
        for (int r = 0; r < num_nodes_; ++r) {
          if (r != root) std::memcpy(op.data[r], op.data[root], count);
        }
      }
      op.done = true;
      changed_.SignalAll();
    }
    const absl::Time deadline = absl::Now() + timeout_;
    absl::Status status;
    while (true) {
      if (op.done) {
        status = op.result;
        break;
      }
      std::vector<std::string> gone;
      for (int r = 0; r < num_nodes_; ++r) {
        if (gone_[r]) gone.push_back(Name(r));
      }
      if (!gone.empty()) {
        status = absl::UnavailableError(
            absl::StrCat("peer node ", absl::StrJoin(gone, ", "), " is gone"));
        break;
      }
      if (absl::Now() >= deadline) {
        std::vector<std::string> missing;
        for (int r = 0; r < num_nodes_; ++r) {
          if (op.data[r] == nullptr) missing.push_back(Name(r));
        }
        status = absl::DeadlineExceededError(
            absl::StrCat(KindName(kind), " #", seq, " timed out after ",
                         absl::FormatDuration(timeout_), " waiting for ",
                         absl::StrJoin(missing, ", ")));
        break;
      }
      changed_.WaitWithDeadline(&mu_, deadline);
    }
    // The op's buffers are only touched under mu_, so leaving is safe. A
    // node leaving an unfinished op fails it for the late arrivals instead
    // of letting them sum a buffer that is gone.
    if (!op.done) {
      op.done = true;
      op.result = absl::UnavailableError(
          absl::StrCat("node ", Name(rank), " gave up on ", KindName(kind),
                       " #", seq, ": ", status.message()));
      changed_.SignalAll();
    }
    op.data[rank] = nullptr;
    if (++op.released == num_nodes_) ops_.erase(seq);
    return status;
  }

 private:
  struct Op {
    std::vector<void*> data;
    int kind = 0;
    size_t count = 0;
    DType dtype = DType::kFloat32;
    int root = 0;
    size_t elem = 0;
    CombineFn combine = nullptr;
    int first = 0;
    int arrived = 0;
    int released = 0;
    bool done = false;
    absl::Status result;
  };

  const int num_nodes_;
  const absl::Duration timeout_;
  std::vector<std::string> names_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  std::vector<bool> gone_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Op> ops_ ABSL_GUARDED_BY(mu_);
};

std::vector<std::unique_ptr<FakeCollectiveBackend>>
FakeCollectiveBackend::CreateGroup(int num_nodes, absl::Duration timeout,
                                   std::vector<std::string> node_names) {
  auto group =
      std::make_shared<Group>(num_nodes, timeout, std::move(node_names));
  std::vector<std::unique_ptr<FakeCollectiveBackend>> backends;
  for (int r = 0; r < num_nodes; ++r) {
    backends.push_back(std::unique_ptr<FakeCollectiveBackend>(
        new FakeCollectiveBackend(group, r)));
  }
  return backends;
}

FakeCollectiveBackend::~FakeCollectiveBackend() { Leave(); }

void FakeCollectiveBackend::Leave() { group_->Leave(node_rank_); }

int FakeCollectiveBackend::num_nodes() const { return group_->num_nodes(); }

std::string FakeCollectiveBackend::NodeName(int node_rank) const {
  return group_->Name(node_rank);
}

absl::Status FakeCollectiveBackend::Run(int kind, void* data, size_t count,
                                        DType dtype, int root, size_t elem,
                                        CombineFn combine) {
  if (!broken_.ok()) return broken_;
  absl::Status status = group_->Run(node_rank_, next_seq_++, kind, data, count,
                                    dtype, root, elem, combine);
  if (!status.ok()) {
    broken_ = absl::Status(
        status.code(), absl::StrCat("fake backend, node ", NodeName(node_rank_),
                                    ": ", status.message()));
  }
  return broken_;
}

absl::Status FakeCollectiveBackend::AllreduceSum(void* data, size_t count,
                                                 DType dtype) {
  if (absl::Status s = CheckWireDType("fake AllreduceSum", dtype); !s.ok()) {
    return s;
  }
  ++allreduce_calls_;
  allreduce_bytes_ += static_cast<int64_t>(count * DTypeSize(dtype));
  allreduce_dtypes_.push_back(dtype);
  return Run(kAllreduce, data, count, dtype, 0);
}

absl::Status FakeCollectiveBackend::AllreduceAverage(const LocalAverage& work) {
  ++average_calls_;
  if (work.to_sum == 1 && work.buffers.size() > 1) ++presummed_average_calls_;
  return CollectiveBackendInterface::AllreduceAverage(work);
}

absl::Status FakeCollectiveBackend::AllreduceWith(void* data, size_t count,
                                                  size_t elem_bytes,
                                                  CombineFn combine) {
  if (combine == nullptr || elem_bytes == 0) {
    return absl::InvalidArgumentError("fake AllreduceWith: no combine");
  }
  ++with_calls_;
  return Run(kCombine, data, count, DType::kFloat32, 0, elem_bytes, combine);
}

absl::Status FakeCollectiveBackend::Broadcast(void* data, size_t bytes,
                                              int root_node) {
  if (root_node < 0 || root_node >= num_nodes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake Broadcast: root node ", root_node, " out of range"));
  }
  ++broadcast_calls_;
  return Run(kBroadcast, data, bytes, DType::kFloat32, root_node);
}

}  // namespace gradd
