// ClientImpl: gradd::Client over one attach (session/attach.cc makes it):
// the daemon's connection (session socket, gRPC stub), the control block and
// this rank's bucket memory mapped, and the data path on them: a pure
// shared-memory path (control block + bucket memory, doorbells).
//
// Life of a client:
//
//   Attach():  connect <socket>.session (retry until connect_timeout)
//                -> SessionHello (session id)
//                -> Node.Attach RPC over unix:<socket> (blocks for all ranks)
//                -> SessionFds + [control block fd, rank memory fd]
//                -> validate seals, sizes, layout and plan; map   (Init)
//   iterate:   MarkReady(i)... (any thread)  WaitAll() (one thread)
//   Detach():  Detach RPC (best effort), close the session socket.
//
// The session socket stays open for the client's life: its closing is how
// the daemon learns that this rank died, and its hang-up is how we learn
// that the daemon died (checked while waiting, so a crashed daemon is an
// UNAVAILABLE error within a fraction of a second, not a wait_timeout hang).
//
// Where the members are defined:
//   client_impl.cc         Init (what the daemon sent, checked), the data
//                          path (MarkReady, WaitAll), failures, Detach,
//                          SetCommHook
//   client_collectives.cc  Broadcast and the collectives' rounds on the
//                          area (area_collectives.h splits calls into rounds)
//   client_rebuild.cc      RebuildBuckets: plan/'s rebuild applied to this
//                          client's views and gradients
//   client_wait_bucket.cc  WaitBucketOn: one bucket of the iteration
//   here                   Wait, a template over the caller's predicate
// Join (join/), the plan's checks, the rebuild RPC and the moves (plan/)
// and the CUDA memory (device/) are components of their own that ClientImpl
// drives.
//
// Threads: as gradd::Client (client.h): MarkReady from any thread, the rest
// from one caller thread at a time. Errors: the first error that ends the
// client (job failure, daemon gone, timeout, detach) is kept and returned by
// every later call.
#ifndef GRADD_CLIENT_SRC_DATA_CLIENT_IMPL_H_
#define GRADD_CLIENT_SRC_DATA_CLIENT_IMPL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/src/data/area_collectives.h"
#include "client/src/data/rank_restart.h"
#include "client/src/device/device_client.h"
#include "client/src/join/join_client.h"
#include "client/src/plan/plan_views.h"
#include "client/src/plan/rebuild.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/shm.h"
#include "common/status_macros.h"
#include "gradd/client.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace gradd::internal {

using Clock = std::chrono::steady_clock;

// Spin before sleeping on the futex. Small buckets finish within tens of
// microseconds; longer spinning would take a core away from the daemon on
// small machines (2 cores shared by the daemon and every trainer).
inline constexpr std::chrono::microseconds kSpin{30};
// While blocked, how often we check that the daemon is still there.
inline constexpr std::chrono::milliseconds kLivenessSlice{200};

// now + d for a caller-supplied duration: negative means "no time",
// anything beyond a year is treated as a year, so that "wait forever"
// (milliseconds::max()) cannot overflow the clock.
template <typename C>
typename C::time_point After(std::chrono::milliseconds d) {
  constexpr std::chrono::milliseconds kYear = std::chrono::hours(24 * 365);
  return C::now() + std::clamp(d, std::chrono::milliseconds(0), kYear);
}

// One registered parameter: its gradient's place in the current plan.
struct ParamSlot {
  std::string name;
  char* data = nullptr;
  size_t bytes = 0;
  int bucket = -1;
};

// The Client that Client::Attach returns (decorated by data/used_map_client.h
// with find_unused_parameters).
class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, std::string socket_path,
             ControlLayout layout)
      : options_(options),
        socket_path_(std::move(socket_path)),
        layout_(layout) {}

  ~ClientImpl() override { Detach().IgnoreError(); }

  // Everything Attach() does after the fds arrived: validation of what the
  // daemon sent and construction of the per-parameter views. Any
  // inconsistency is INTERNAL: it means a daemon/library version mismatch
  // or a bug, and we must not write outside the mapping.
  absl::Status Init(const std::vector<ClientParam>& params,
                    const v1::AttachResponse& response, UniqueFd control_fd,
                    UniqueFd memory_fd, UniqueFd rank_control_fd,
                    UniqueFd bell_fd);

  void* gradient(int param) const override {
    if (param < 0 || param >= num_params()) return nullptr;
    return params_[param].data;
  }
  size_t gradient_bytes(int param) const override {
    if (param < 0 || param >= num_params()) return 0;
    return params_[param].bytes;
  }
  int num_params() const override { return static_cast<int>(params_.size()); }

  absl::Status MarkReady(int param) override {
    return MarkReadyOn(param, nullptr);
  }
  absl::Status MarkReadyOn(int param, void* cuda_stream) override;
  absl::Status WaitAll() override { return WaitAllOn(nullptr); }
  absl::Status WaitAllOn(void* cuda_stream) override;
  int gradient_device(int param) const override {
    if (param < 0 || param >= num_params()) return 0;
    return buckets_[params_[param].bucket].device;
  }
  // Before Init: this rank's device memory and events (CUDA buckets).
  void SetDevice(std::unique_ptr<DeviceClient> device) {
    device_ = std::move(device);
  }
  bool BucketDone(int bucket) const override;
  // client_wait_bucket.cc.
  absl::Status WaitBucketOn(int bucket, void* cuda_stream) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  // Collectives (collectives.h): area_collectives.h splits them into
  // rounds on the collective area.
  absl::Status Allreduce(void* data, size_t count, int32_t dtype,
                         ReduceOp op) override {
    return AreaAllreduce(area_, data, count, dtype, op);
  }
  absl::Status Allgather(const void* input, size_t bytes,
                         void* output) override {
    return AreaAllgather(area_, input, bytes, output);
  }
  absl::Status ReduceScatter(const void* input, void* output, size_t count,
                             int32_t dtype, ReduceOp op) override {
    return AreaReduceScatter(area_, input, output, count, dtype, op);
  }
  absl::Status Barrier() override { return AreaBarrier(area_); }
  absl::Status Detach() override;
  absl::StatusOr<bool> RebuildBuckets() override;
  bool buckets_rebuilt() const override { return rebuilt_; }
  uint64_t next_plan_switch() const override { return next_switch_; }
  std::vector<int32_t> ready_order() const override {
    return recorder_->last();
  }

  // Join: join_client.h does the work; these add the Client's state.
  absl::Status JoinEnter(const JoinOptions& options) override {
    RETURN_IF_ERROR(CheckFailed());
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (pending_[b].load(std::memory_order_acquire) !=
          static_cast<int32_t>(buckets_[b].params.size())) {
        return absl::FailedPreconditionError(absl::StrCat(
            "JoinEnter in the middle of iteration ", iteration(), " (", Who(),
            "); enter join mode between iterations (after WaitAll)"));
      }
    }
    return join_->Enter(options, iteration());
  }
  bool in_join() const override { return join_ != nullptr && join_->in_join(); }
  absl::Status JoinActive(void* sync_data, size_t sync_bytes) override {
    RETURN_IF_ERROR(CheckFailed());
    JoinClient::CatchUp catch_up;
    absl::Status s =
        join_->Active(iteration(), sync_data, sync_bytes, &catch_up);
    if (catch_up.next_iteration > 0) CatchUpAfterJoin(catch_up);
    return s;
  }
  absl::StatusOr<JoinResult> Join() override {
    RETURN_IF_ERROR(CheckFailed());
    JoinClient::CatchUp catch_up;
    absl::StatusOr<JoinResult> r = join_->Join(iteration(), &catch_up);
    if (catch_up.next_iteration > 0) CatchUpAfterJoin(catch_up);
    return r;
  }
  absl::Status SetCommHook(const CommHookOptions& hook) override;

  int num_buckets() const override { return static_cast<int>(buckets_.size()); }
  const BucketInfo& bucket(int b) const override {
    static const BucketInfo kNone{};
    if (b < 0 || b >= num_buckets()) return kNone;
    return buckets_[b];
  }
  uint64_t iteration() const override {
    return iteration_.load(std::memory_order_relaxed);
  }
  int global_rank() const override { return global_rank_; }
  int world_size() const override { return world_size_; }
  int local_rank() const override { return options_.local_rank; }
  int local_world_size() const override { return options_.local_world_size; }

  // Rank restart (rank_restart.h; client.h "Rank restart"). A restarted
  // client starts at AttachResponse.next_iteration and collective_seq, and
  // never rebuilds its buckets: the running job already has its plan (the
  // attach answer carries it), and the other ranks will not rebuild again.
  bool restarted() const override { return restart_.restarted(); }
  uint32_t rank_restart_grace_ms() const override {
    return restart_.grace_ms();
  }
  bool StateSyncPending() const override { return restart_.SyncPending(); }
  absl::StatusOr<int> BeginStateSync() override;
  uint64_t iterations_aborted() const override {
    return restart_.iterations_aborted();
  }
  uint64_t restarts() const override { return restart_.restarts(); }
  // Node loss and arrival (client.h; rank_restart.h).
  uint32_t min_nodes() const override { return min_nodes_; }
  int live_world_size() const override {
    const int live = restart_.live_world_size();
    return live > 0 ? live : world_size_;
  }
  uint64_t epoch() const override { return restart_.epoch(); }
  bool state_behind() const override { return restart_.StateBehind(); }

  void SetConnection(UniqueFd session, uint64_t session_id,
                     std::shared_ptr<grpc::Channel> channel) {
    session_ = std::move(session);
    session_id_ = session_id;
    channel_ = std::move(channel);
    stub_ = v1::Node::NewStub(channel_);
  }

 private:
  // The first error that ended this client (job failure, daemon gone,
  // timeout, detach); OK while healthy. Two atomic loads on the fast path.
  absl::Status CheckFailed() const;
  // Records `status` as this client's terminal error (first one wins) and
  // returns the terminal error.
  absl::Status Fail(absl::Status status) const;
  // Whether the daemon still holds our session socket open.
  bool DaemonAlive() const;
  // Blocks until `ready()`; sliced so that a dead daemon is noticed even if
  // it could not publish an error. `what` describes the wait for errors.
  template <typename Pred>
  absl::Status Wait(Pred ready, const std::string& what);
  void CatchUpAfterJoin(const JoinClient::CatchUp& c) {
    iteration_.store(c.next_iteration, std::memory_order_release);
    broadcast_seq_ = std::max(broadcast_seq_, c.bcast_seq);
  }
  // Broadcast without the join-mode check (JoinActive's sync uses it).
  absl::Status BroadcastImpl(void* data, size_t bytes, int root) {
    RETURN_IF_ERROR(CheckFailed());
    return AreaBroadcast(area_, data, bytes, root);
  }
  // One collective round on the area (common/control_block.h), whose
  // contents the caller has written: publishes the round, waits for the
  // daemon.
  absl::Status AreaRound(CollectiveKind kind, int32_t dtype, int32_t op,
                         uint64_t bytes, int32_t root);
  // This client's collective area and rounds, as area_collectives.h sees
  // them (the caller thread's).
  class Area final : public CollectiveAreaInterface {
   public:
    explicit Area(ClientImpl* client) : client_(client) {}
    char* area() override { return client_->broadcast_area_; }
    size_t area_bytes() const override { return client_->broadcast_bytes_; }
    int global_rank() const override { return client_->global_rank_; }
    int world_size() const override { return client_->world_size_; }
    std::string Who() const override { return client_->Who(); }
    absl::Status Usable(absl::string_view what) const override;
    absl::Status Round(CollectiveKind kind, int32_t dtype, int32_t op,
                       uint64_t bytes, int32_t root) override {
      return client_->AreaRound(kind, dtype, op, bytes, root);
    }

   private:
    ClientImpl* const client_;
  };
  // Points the parameters and buckets at `views` and resets the per-bucket
  // counters (between iterations only).
  void UsePlan(PlanViews views);
  std::string Who() const {
    return absl::StrCat("job '", options_.job_id, "', local rank ",
                        options_.local_rank);
  }

  const ClientOptions options_;
  const std::string socket_path_;
  const ControlLayout layout_;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Node::Stub> stub_;
  UniqueFd session_;
  uint64_t session_id_ = 0;
  bool detached_ = false;

  // The job block (read-only) and this rank's block (common/control_block.h).
  ControlMapping control_;
  Mapping memory_;
  ControlHeader* header_ = nullptr;
  RankHeader* me_ = nullptr;
  UniqueFd bell_;
  std::atomic<uint64_t>* ready_row_ = nullptr;
  std::atomic<uint64_t>* done_seq_ = nullptr;
  char* broadcast_area_ = nullptr;
  size_t broadcast_bytes_ = 0;
  uint64_t broadcast_seq_ = 0;
  Area area_{this};

  std::vector<ParamSlot> params_;
  std::vector<BucketInfo> buckets_;
  // As registered, for checking a rebuilt plan.
  std::vector<std::string> names_;
  std::vector<int32_t> dtypes_;
  std::vector<size_t> bytes_;
  uint64_t bucket_region_bytes_ = 0;
  std::unique_ptr<ReadyOrderRecorder> recorder_;
  bool rebuilt_ = false;
  // Autotune: the daemon's next plan switch (0: none).
  uint64_t next_switch_ = 0;
  bool daemon_can_rebuild_ = false;
  // Parameters still to be marked in each bucket this iteration.
  std::unique_ptr<std::atomic<int32_t>[]> pending_;
  // The iteration in which each parameter was last marked (0 = never), so
  // a new iteration needs no reset pass over all parameters.
  std::unique_ptr<std::atomic<uint64_t>[]> marked_;
  std::atomic<uint64_t> iteration_{1};
  int global_rank_ = 0;
  int world_size_ = 0;
  uint32_t min_nodes_ = 0;

  std::unique_ptr<JoinClient> join_;
  // Rank restart: aborted iterations / rounds, the state sync.
  RankRestart restart_;
  // CUDA buckets: the imported device memory and the event handshake.
  std::unique_ptr<DeviceClient> device_;

  mutable std::atomic<bool> failed_{false};
  mutable absl::Mutex mu_;
  mutable absl::Status terminal_ ABSL_GUARDED_BY(mu_);
};

template <typename Pred>
absl::Status ClientImpl::Wait(Pred ready, const std::string& what) {
  const Clock::time_point deadline = After<Clock>(options_.wait_timeout);
  while (true) {
    const auto slice = std::min<std::chrono::nanoseconds>(
        kLivenessSlice, deadline - Clock::now());
    if (WaitForDaemon(header_, me_, ready, kSpin, slice))
      return absl::OkStatus();
    if (header_->status.load(std::memory_order_acquire) != 0) {
      return Fail(ReadError(header_));
    }
    if (const uint64_t beat =
            header_->heartbeat_ns.load(std::memory_order_acquire);
        MonotonicNs() - beat >
        static_cast<uint64_t>(options_.heartbeat_timeout.count()) * 1000000u) {
      if (header_->status.load(std::memory_order_acquire) != 0) {
        return Fail(ReadError(header_));
      }
      return Fail(absl::UnavailableError(
          absl::StrCat("gradd daemon at ", socket_path_,
                       " not responding: no heartbeat for ",
                       (MonotonicNs() - beat) / 1000000, " ms (", Who(),
                       ", waiting for ", what,
                       "); is it stopped (SIGSTOP) or wedged? The limit is "
                       "heartbeat_timeout / GRADD_HEARTBEAT_TIMEOUT_MS")));
    }
    if (!DaemonAlive()) {
      // The daemon may have published its error just before closing.
      if (header_->status.load(std::memory_order_acquire) != 0) {
        return Fail(ReadError(header_));
      }
      return Fail(absl::UnavailableError(
          absl::StrCat("gradd daemon at ", socket_path_, " went away (", Who(),
                       ") while waiting for ", what)));
    }
    if (Clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat("gradd did not finish ", what, " within ",
                       options_.wait_timeout.count(), " ms (", Who(), ")")));
    }
  }
}

}  // namespace gradd::internal

#endif  // GRADD_CLIENT_SRC_DATA_CLIENT_IMPL_H_
