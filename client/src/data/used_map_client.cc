// UsedMapClient (used_map_client.h) and the defaults of the find_unused_
// parameters calls for clients without a used map.
#include "client/src/data/used_map_client.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradd {

absl::Status Client::MarkUnused(int param, UnusedGradient) {
  return absl::FailedPreconditionError(
      absl::StrCat("MarkUnused(", param,
                   ") needs a client attached with "
                   "ClientOptions::find_unused_parameters"));
}

bool Client::GloballyUsed(int param) const {
  return param >= 0 && param < num_params();
}

absl::Status Client::SkipUsedMap() { return absl::OkStatus(); }

namespace {

// How many unmarked parameters an error message names (as client_impl.cc).
constexpr size_t kNamedInErrors = 5;

class UsedMapClient final : public Client {
 public:
  UsedMapClient(std::unique_ptr<Client> inner, std::vector<std::string> names,
                std::string who)
      : inner_(std::move(inner)),
        names_(std::move(names)),
        who_(std::move(who)),
        marked_(names_.size()),
        used_(names_.size(), false) {
    for (auto& m : marked_) m.store(0, std::memory_order_relaxed);
  }

  void* gradient(int param) const override {
    return Known(param) ? inner_->gradient(param + 1) : nullptr;
  }
  size_t gradient_bytes(int param) const override {
    return Known(param) ? inner_->gradient_bytes(param + 1) : 0;
  }
  int num_params() const override { return static_cast<int>(names_.size()); }

  absl::Status MarkReady(int param) override {
    return MarkReadyOn(param, nullptr);
  }
  absl::Status MarkReadyOn(int param, void* cuda_stream) override {
    RETURN_IF_ERROR(Claim(param));
    const uint64_t it = inner_->iteration();
    if (skipped_.load(std::memory_order_acquire) != it) Map()[param] = 1.0f;
    return inner_->MarkReadyOn(param + 1, cuda_stream);
  }
  int gradient_device(int param) const override {
    return Known(param) ? inner_->gradient_device(param + 1) : 0;
  }

  absl::Status MarkUnused(int param, UnusedGradient gradient) override {
    if (gradient == UnusedGradient::kZero && Known(param) &&
        inner_->gradient_device(param + 1) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "MarkUnused(", param, ", kZero): parameter '", names_[param],
          "' has a CUDA gradient, which the library cannot zero without a "
          "stream; zero it on your stream and pass UnusedGradient::kKeep"));
    }
    RETURN_IF_ERROR(Claim(param));
    if (gradient == UnusedGradient::kZero) {
      std::memset(inner_->gradient(param + 1), 0,
                  inner_->gradient_bytes(param + 1));
    }
    return inner_->MarkReady(param + 1);
  }

  bool GloballyUsed(int param) const override {
    return Known(param) && used_[param];
  }

  absl::Status SkipUsedMap() override {
    const uint64_t it = inner_->iteration();
    if (skipped_.load(std::memory_order_relaxed) == it) return absl::OkStatus();
    std::fill(Map(), Map() + names_.size(), 1.0f);
    skipped_.store(it, std::memory_order_release);
    return inner_->MarkReady(0);
  }

  absl::Status WaitAll() override { return WaitAllOn(nullptr); }
  absl::Status WaitAllOn(void* cuda_stream) override {
    const uint64_t it = inner_->iteration();
    std::vector<int> missing;
    for (int i = 0; i < num_params(); ++i) {
      if (marked_[i].load(std::memory_order_acquire) != it) {
        missing.push_back(i);
      }
    }
    if (!missing.empty()) return MissingError(missing, it);
    if (skipped_.load(std::memory_order_relaxed) != it) {
      RETURN_IF_ERROR(inner_->MarkReady(0));
    }
    if (absl::Status s = inner_->WaitAllOn(cuda_stream);
        IsIterationAborted(s)) {
      // Rank restart: the iteration is over without averages (the map
      // holds this rank's own marks); the next one starts from "used by
      // nobody" and GloballyUsed keeps the last real answer.
      std::memset(Map(), 0, names_.size() * sizeof(float));
      return s;
    } else if (!s.ok()) {
      return s;
    }
    const float* map = Map();
    for (size_t i = 0; i < names_.size(); ++i) used_[i] = map[i] > 0.0f;
    // The next iteration starts from "used by nobody".
    std::memset(Map(), 0, names_.size() * sizeof(float));
    return absl::OkStatus();
  }

  bool BucketDone(int bucket) const override {
    return inner_->BucketDone(bucket);
  }
  absl::Status WaitBucketOn(int bucket, void* cuda_stream) override {
    return inner_->WaitBucketOn(bucket, cuda_stream);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Allreduce(void* data, size_t count, int32_t dtype,
                         ReduceOp op) override {
    return inner_->Allreduce(data, count, dtype, op);
  }
  absl::Status Allgather(const void* input, size_t bytes,
                         void* output) override {
    return inner_->Allgather(input, bytes, output);
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count,
                             int32_t dtype, ReduceOp op) override {
    return inner_->ReduceScatter(input, output, count, dtype, op);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status JoinEnter(const JoinOptions& options) override {
    return inner_->JoinEnter(options);
  }
  bool in_join() const override { return inner_->in_join(); }
  absl::Status JoinActive(void* sync_data, size_t sync_bytes) override {
    return inner_->JoinActive(sync_data, sync_bytes);
  }
  absl::StatusOr<JoinResult> Join() override { return inner_->Join(); }
  absl::Status SetCommHook(const CommHookOptions& hook) override {
    return inner_->SetCommHook(hook);
  }
  // The inner client plans with the map included (it is one more
  // parameter to the daemon); the order shown hides it.
  absl::StatusOr<bool> RebuildBuckets() override {
    return inner_->RebuildBuckets();
  }
  bool buckets_rebuilt() const override { return inner_->buckets_rebuilt(); }
  uint64_t next_plan_switch() const override {
    return inner_->next_plan_switch();
  }
  std::vector<int32_t> ready_order() const override {
    std::vector<int32_t> out;
    for (int32_t i : inner_->ready_order()) {
      if (i > 0) out.push_back(i - 1);
    }
    return out;
  }
  absl::Status Detach() override { return inner_->Detach(); }
  int num_buckets() const override { return inner_->num_buckets(); }
  // Translated on each call (the inner plan may change, e.g. when buckets
  // are rebuilt); the reference stays valid until the next bucket(b) call.
  const BucketInfo& bucket(int b) const override {
    static const BucketInfo kNone{};
    if (b < 0 || b >= num_buckets()) return kNone;
    if (buckets_.size() != static_cast<size_t>(num_buckets())) {
      buckets_.resize(num_buckets());
    }
    const BucketInfo& info = inner_->bucket(b);
    BucketInfo& out = buckets_[b];
    out.dtype = info.dtype;
    out.size_bytes = info.size_bytes;
    out.params.clear();
    for (int32_t i : info.params) {
      if (i > 0) out.params.push_back(i - 1);
    }
    return out;
  }
  uint64_t iteration() const override { return inner_->iteration(); }
  int global_rank() const override { return inner_->global_rank(); }
  int world_size() const override { return inner_->world_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_world_size() const override { return inner_->local_world_size(); }
  bool restarted() const override { return inner_->restarted(); }
  uint32_t rank_restart_grace_ms() const override {
    return inner_->rank_restart_grace_ms();
  }
  bool StateSyncPending() const override { return inner_->StateSyncPending(); }
  absl::StatusOr<int> BeginStateSync() override {
    return inner_->BeginStateSync();
  }
  uint64_t iterations_aborted() const override {
    return inner_->iterations_aborted();
  }
  uint64_t restarts() const override { return inner_->restarts(); }
  uint32_t min_nodes() const override { return inner_->min_nodes(); }
  int live_world_size() const override { return inner_->live_world_size(); }
  uint64_t epoch() const override { return inner_->epoch(); }
  bool state_behind() const override { return inner_->state_behind(); }

 private:
  bool Known(int param) const { return param >= 0 && param < num_params(); }
  // The hidden parameter's gradient memory, looked up each time: the inner
  // client owns where it lives.
  float* Map() const { return static_cast<float*>(inner_->gradient(0)); }

  // Records `param` as marked in the current iteration; the errors name the
  // caller's index (the inner client would name index + 1).
  absl::Status Claim(int param) {
    if (!Known(param)) {
      return absl::OutOfRangeError(
          absl::StrCat("MarkReady(", param, "): unknown parameter index; ",
                       who_, " registered ", num_params(),
                       " parameters (indices 0..", num_params() - 1, ")"));
    }
    const uint64_t it = inner_->iteration();
    if (marked_[param].exchange(it, std::memory_order_acq_rel) == it) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter '", names_[param], "' (index ", param,
          ") marked ready twice in iteration ", it, " (", who_,
          "); a parameter's gradient may be marked ready only once per "
          "iteration (a parameter shared by several modules, or reentrant "
          "backward, can cause this)"));
    }
    return absl::OkStatus();
  }

  absl::Status MissingError(const std::vector<int>& missing,
                            uint64_t it) const {
    std::string names;
    for (size_t k = 0; k < std::min(missing.size(), kNamedInErrors); ++k) {
      absl::StrAppend(&names, k ? ", '" : "'", names_[missing[k]], "' (index ",
                      missing[k], ")");
    }
    if (missing.size() > kNamedInErrors) {
      absl::StrAppend(&names, " and ", missing.size() - kNamedInErrors,
                      " more");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        missing.size(), " of ", num_params(),
        " parameters were not marked ready in iteration ", it, " (", who_,
        "): ", names,
        "; with find_unused_parameters, mark each parameter either ready "
        "(MarkReady) or unused (MarkUnused) every iteration"));
  }

  const std::unique_ptr<Client> inner_;
  const std::vector<std::string> names_;
  const std::string who_;
  mutable std::vector<BucketInfo> buckets_;  // bucket(b)'s answers
  // Iteration in which each parameter was last marked (ready or unused).
  std::vector<std::atomic<uint64_t>> marked_;
  // Iteration whose map was handed over early by SkipUsedMap (0: none).
  std::atomic<uint64_t> skipped_{0};
  // Result of the last WaitAll (touched by the WaitAll thread only).
  std::vector<bool> used_;
};

}  // namespace

std::unique_ptr<Client> NewUsedMapClient(std::unique_ptr<Client> inner,
                                         std::vector<std::string> names,
                                         std::string who) {
  return std::make_unique<UsedMapClient>(std::move(inner), std::move(names),
                                         std::move(who));
}

}  // namespace gradd
