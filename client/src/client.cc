// gradd::Client: attach over the session socket + gRPC, then a pure
// shared-memory data path (control block + bucket memory, doorbells).
//
// Life of a client:
//
//   Attach():  connect <socket>.session (retry until connect_timeout)
//                -> SessionHello (session id)
//                -> Node.Attach RPC over unix:<socket> (blocks for all ranks)
//                -> SessionFds + [control block fd, rank memory fd]
//                -> validate seals, sizes, layout and plan; map
//   iterate:   MarkReady(i)... (any thread)  WaitAll() (one thread)
//   Detach():  Detach RPC (best effort), close the session socket.
//
// The session socket stays open for the client's life: its closing is how
// the daemon learns that this rank died, and its hang-up is how we learn
// that the daemon died (checked while waiting, so a crashed daemon is an
// UNAVAILABLE error within a fraction of a second, not a wait_timeout hang).
#include "gradd/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "attach_internal.h"
#include "client/src/area_collectives.h"
#include "client/src/comm_hook_options.h"
#include "client/src/daemon_peer.h"
#include "client/src/device_client.h"
#include "client/src/join_client.h"
#include "client/src/launcher_env.h"
#include "client/src/plan_move.h"
#include "client/src/plan_views.h"
#include "client/src/rebuild.h"
#include "common/client_strings.h"
#include "common/control_block.h"
#include "common/control_mapping.h"
#include "common/doorbell.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/session.h"
#include "common/shm.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "gradd/v1/node.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "used_map_client.h"

namespace gradd {

// The public constants (client.h, gradd.h) are the internal DType values.
static_assert(dtype::kFloat32 == static_cast<int32_t>(DType::kFloat32));
static_assert(dtype::kFloat64 == static_cast<int32_t>(DType::kFloat64));
static_assert(dtype::kFloat16 == static_cast<int32_t>(DType::kFloat16));
static_assert(dtype::kBFloat16 == static_cast<int32_t>(DType::kBFloat16));
namespace {

using Clock = std::chrono::steady_clock;

// Spin before sleeping on the futex. Small buckets finish within tens of
// microseconds; longer spinning would take a core away from the daemon on
// small machines (2 cores shared by the daemon and every trainer).
constexpr std::chrono::microseconds kSpin{30};
// While blocked, how often we check that the daemon is still there.
constexpr std::chrono::milliseconds kLivenessSlice{200};
// The daemon sends the fds before the Attach RPC returns, so they are
// already queued; this only guards against a broken daemon.
constexpr std::chrono::milliseconds kFdsTimeout{5000};
constexpr std::chrono::milliseconds kDetachDeadline{1000};
constexpr std::chrono::milliseconds kConnectRetry{20};
// How many unmarked parameters an error message names.
constexpr size_t kNamedInErrors = 5;

// now + d for a caller-supplied duration: negative means "no time",
// anything beyond a year is treated as a year, so that "wait forever"
// (milliseconds::max()) cannot overflow the clock.
template <typename C>
typename C::time_point After(std::chrono::milliseconds d) {
  constexpr std::chrono::milliseconds kYear = std::chrono::hours(24 * 365);
  return C::now() + std::clamp(d, std::chrono::milliseconds(0), kYear);
}

std::chrono::milliseconds Left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

// Connects to the daemon's session socket, retrying while nobody listens
// (the daemon may still be starting) until `timeout` has passed.
absl::StatusOr<UniqueFd> ConnectSession(const std::string& socket_path,
                                        std::chrono::milliseconds timeout) {
  const std::string session_path = SessionSocketPath(socket_path);
  const std::optional<sockaddr_un> addr = UnixAddress(session_path);
  if (!addr.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradd socket path '", socket_path, "' is too long for a Unix socket (",
        sizeof(sockaddr_un::sun_path) - 1 -
            (session_path.size() - socket_path.size()),
        " bytes at most)"));
  }

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = After<Clock>(timeout);
  int last_errno = 0;
  while (true) {
    absl::StatusOr<UniqueFd> fd = UnixSocket(SOCK_SEQPACKET);
    if (!fd.ok()) return fd.status();
    last_errno = ConnectUnix(fd->get(), *addr);
    if (last_errno == 0) return fd;
    // Nothing there yet (ENOENT), a stale socket file or a daemon still
    // starting (ECONNREFUSED), a full backlog (EAGAIN): worth retrying.
    // Anything else (EACCES, ENOTDIR, ...) will not fix itself.
    const bool retryable = last_errno == ENOENT || last_errno == ECONNREFUSED ||
                           last_errno == EAGAIN;
    if (!retryable || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min(kConnectRetry, Left(deadline)));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::now() - start);
  std::string what = absl::StrCat(
      "no gradd daemon at ", socket_path, ": connecting to ", session_path,
      " failed (", std::strerror(last_errno), ") for ", waited.count(),
      " ms; start gradd with --socket ", socket_path,
      " or point GRADD_SOCKET at the daemon's socket");
  if (last_errno == EACCES || last_errno == EPERM) {
    return absl::PermissionDeniedError(what);
  }
  return absl::UnavailableError(what);
}

struct ParamSlot {
  std::string name;
  char* data = nullptr;
  size_t bytes = 0;
  int bucket = -1;
};

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
  bool daemon_can_rebuild_ = false;
  // Parameters still to be marked in each bucket this iteration.
  std::unique_ptr<std::atomic<int32_t>[]> pending_;
  // The iteration in which each parameter was last marked (0 = never), so
  // a new iteration needs no reset pass over all parameters.
  std::unique_ptr<std::atomic<uint64_t>[]> marked_;
  std::atomic<uint64_t> iteration_{1};
  int global_rank_ = 0;
  int world_size_ = 0;

  std::unique_ptr<JoinClient> join_;
  // CUDA buckets: the imported device memory and the event handshake.
  std::unique_ptr<DeviceClient> device_;

  mutable std::atomic<bool> failed_{false};
  mutable absl::Mutex mu_;
  mutable absl::Status terminal_ ABSL_GUARDED_BY(mu_);
};

absl::Status ClientImpl::Init(const std::vector<ClientParam>& params,
                              const v1::AttachResponse& response,
                              UniqueFd control_fd, UniqueFd memory_fd,
                              UniqueFd rank_control_fd, UniqueFd bell_fd) {
  auto bad = [](absl::string_view what) {
    return absl::InternalError(absl::StrCat(
        "gradd sent an inconsistent attach response (daemon and client "
        "library versions differ?): ",
        what));
  };
  // The control block.
  if (response.control_block_bytes() != layout_.job_bytes()) {
    return bad(absl::StrCat("control block of ", response.control_block_bytes(),
                            " bytes, the layout needs ", layout_.job_bytes()));
  }
  RETURN_IF_ERROR(CheckSealedMemfd(control_fd.get(), layout_.job_bytes()));
  RETURN_IF_ERROR(
      CheckSealedMemfd(rank_control_fd.get(), layout_.rank_block_bytes()));
  const auto me = static_cast<uint32_t>(options_.local_rank);
  ASSIGN_OR_RETURN(control_,
                   ControlMapping::MapRank(layout_, control_fd.get(), me,
                                           rank_control_fd.get()));
  RETURN_IF_ERROR(layout_.Validate(control_.data(), layout_.job_bytes()));
  header_ = layout_.header(control_.data());
  me_ = layout_.rank_header(control_.data(), me);
  bell_ = std::move(bell_fd);
  ready_row_ = layout_.ready_row(control_.data(),
                                 static_cast<uint32_t>(options_.local_rank));
  done_seq_ = layout_.done_seq(control_.data());

  // This rank's bucket memory (+ broadcast area).
  const uint64_t mem_bytes = response.rank_memory_bytes();
  RETURN_IF_ERROR(CheckSealedMemfd(memory_fd.get(), mem_bytes));
  if (mem_bytes > 0) {
    ASSIGN_OR_RETURN(memory_, Mapping::Map(memory_fd.get(), mem_bytes));
  }
  char* base = static_cast<char*>(memory_.data());
  auto fits = [mem_bytes](uint64_t offset, uint64_t size) {
    return offset <= mem_bytes && size <= mem_bytes - offset;
  };
  if (response.broadcast_bytes() > 0) {
    if (!fits(response.broadcast_offset(), response.broadcast_bytes())) {
      return bad("broadcast area outside the rank memory");
    }
    broadcast_area_ = base + response.broadcast_offset();
    broadcast_bytes_ = response.broadcast_bytes();
  }

  // Parameters: sizes from what we registered, places from the plan.
  params_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ClientParam& p = params[i];
    auto dtype = DTypeFromInt(p.dtype);
    if (!dtype.ok()) return bad(dtype.status().message());
    size_t numel = 1;
    for (int64_t d : p.shape) {
      if (d < 0) return bad(absl::StrCat("negative dimension in ", p.name));
      if (d != 0 && numel > SIZE_MAX / static_cast<size_t>(d)) {
        return bad(absl::StrCat("size of ", p.name, " overflows"));
      }
      numel *= static_cast<size_t>(d);
    }
    if (numel > mem_bytes + response.device_memory_bytes()) {
      return bad(absl::StrCat(p.name, " is too large"));
    }
    params_[i].name = p.name;
    params_[i].bytes = numel * DTypeSize(*dtype);
  }

  // Any later plan (bucket rebuild) lies in the bucket region; older
  // daemons do not say, and cannot rebuild: the whole memory then.
  daemon_can_rebuild_ = response.bucket_region_bytes() > 0;
  bucket_region_bytes_ =
      daemon_can_rebuild_ ? response.bucket_region_bytes() : mem_bytes;
  if (bucket_region_bytes_ > mem_bytes) {
    return bad("bucket region larger than the rank memory");
  }
  names_.resize(params_.size());
  dtypes_.resize(params_.size());
  bytes_.resize(params_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    names_[i] = params[i].name;
    dtypes_[i] = params[i].dtype;
    bytes_[i] = params_[i].bytes;
  }
  absl::StatusOr<PlanViews> views =
      MapPlanViews(response.buckets(), names_, dtypes_, bytes_, base,
                   bucket_region_bytes_, device_ ? device_->base() : nullptr,
                   device_ ? response.device_memory_bytes() : 0);
  if (!views.ok()) return bad(views.status().message());
  marked_ = std::make_unique<std::atomic<uint64_t>[]>(params_.size());
  recorder_ = std::make_unique<ReadyOrderRecorder>(params_.size(),
                                                   options_.rebuild_buckets);
  UsePlan(*std::move(views));
  global_rank_ = response.global_rank();
  world_size_ = response.world_size();
  JoinClient::Hooks hooks;
  hooks.wait = [this](const std::function<bool()>& ready,
                      const std::string& what) { return Wait(ready, what); };
  hooks.broadcast = [this](void* data, size_t bytes, int root) {
    return BroadcastImpl(data, bytes, root);
  };
  join_ = std::make_unique<JoinClient>(layout_, control_.data(),
                                       options_.local_rank, bell_.get(),
                                       global_rank_, Who(), std::move(hooks));
  return absl::OkStatus();
}

absl::Status ClientImpl::Fail(absl::Status status) const {
  absl::MutexLock lock(&mu_);
  if (terminal_.ok()) {
    terminal_ = std::move(status);
    failed_.store(true, std::memory_order_release);
  }
  return terminal_;
}

absl::Status ClientImpl::CheckFailed() const {
  if (failed_.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&mu_);
    return terminal_;
  }
  if (header_->status.load(std::memory_order_acquire) != 0) {
    return Fail(ReadError(header_));
  }
  return absl::OkStatus();
}

bool ClientImpl::DaemonAlive() const {
  if (!session_.valid()) return false;
  struct pollfd p = {session_.get(), POLLRDHUP, 0};
  int r;
  do {
    r = poll(&p, 1, 0);
  } while (r < 0 && errno == EINTR);
  return !(r > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)));
}

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

absl::Status ClientImpl::MarkReadyOn(int param, void* cuda_stream) {
  if (param < 0 || param >= num_params()) {
    return absl::OutOfRangeError(
        absl::StrCat("MarkReady(", param, "): unknown parameter index; ", Who(),
                     " registered ", num_params(), " parameters (indices 0..",
                     num_params() - 1, ")"));
  }
  RETURN_IF_ERROR(CheckFailed());
  const uint64_t it = iteration_.load(std::memory_order_relaxed);
  // Join mode: this rank takes part in `it`.
  RETURN_IF_ERROR(join_->NoteActive(it));
  if (marked_[param].exchange(it, std::memory_order_acq_rel) == it) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter '", params_[param].name, "' (index ", param,
        ") marked ready twice in iteration ", it, " (", Who(),
        "); a parameter's gradient may be marked ready only once per "
        "iteration (a parameter shared by several modules, or reentrant "
        "backward, can cause this)"));
  }
  recorder_->Record(param);
  const int b = params_[param].bucket;
  // acq_rel: the last marker's release store below must carry every other
  // marker's gradient writes with it (they precede their fetch_sub).
  if (pending_[b].fetch_sub(1, std::memory_order_acq_rel) == 1) {
    // The stream records the bucket's ready event before the daemon hears
    // of it, so the daemon's wait sees this iteration's record.
    if (buckets_[b].device != 0) {
      if (absl::Status s = device_->RecordReady(b, cuda_stream); !s.ok()) {
        return Fail(s);
      }
    }
    ready_row_[b].store(it, std::memory_order_release);
    RingDaemon(header_, me_, bell_.get());
  }
  return absl::OkStatus();
}

absl::Status ClientImpl::WaitAllOn(void* cuda_stream) {
  RETURN_IF_ERROR(CheckFailed());
  const uint64_t it = iteration_.load(std::memory_order_relaxed);
  bool all_marked = true;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (pending_[b].load(std::memory_order_acquire) != 0) all_marked = false;
  }
  if (!all_marked) {
    std::vector<int> missing;
    for (int i = 0; i < num_params(); ++i) {
      if (marked_[i].load(std::memory_order_acquire) != it) {
        missing.push_back(i);
      }
    }
    std::string names;
    for (size_t k = 0; k < std::min(missing.size(), kNamedInErrors); ++k) {
      absl::StrAppend(&names, k ? ", '" : "'", params_[missing[k]].name,
                      "' (index ", missing[k], ")");
    }
    if (missing.size() > kNamedInErrors) {
      absl::StrAppend(&names, " and ", missing.size() - kNamedInErrors,
                      " more");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        missing.size(), " of ", num_params(),
        " parameters were not marked ready in iteration ", it, " (", Who(),
        "): ", names,
        "; every parameter must be marked ready each iteration (mark unused "
        "parameters ready too, as DDP's find_unused_parameters does)"));
  }

  size_t next = 0;
  auto all_done = [this, it, &next] {
    while (next < buckets_.size() &&
           done_seq_[next].load(std::memory_order_acquire) >= it) {
      ++next;
    }
    return next == buckets_.size();
  };
  RETURN_IF_ERROR(Wait(all_done, absl::StrCat("iteration ", it)));
  // The daemon published done_seq once its reduction was queued; the
  // stream waits for the GPU to finish it.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].device == 0) continue;
    if (absl::Status s = device_->WaitDone(static_cast<int>(b), cuda_stream);
        !s.ok()) {
      return Fail(s);
    }
  }

  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b].store(static_cast<int32_t>(buckets_[b].params.size()),
                      std::memory_order_relaxed);
  }
  recorder_->EndIteration();
  iteration_.store(it + 1, std::memory_order_release);
  return absl::OkStatus();
}

void ClientImpl::UsePlan(PlanViews views) {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].data = views.data[i];
    params_[i].bucket = views.bucket_of[i];
  }
  buckets_ = std::move(views.buckets);
  pending_ = std::make_unique<std::atomic<int32_t>[]>(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b].store(static_cast<int32_t>(buckets_[b].params.size()),
                      std::memory_order_relaxed);
  }
}

absl::StatusOr<bool> ClientImpl::RebuildBuckets() {
  RETURN_IF_ERROR(CheckFailed());
  // A daemon that reserved no bucket region (older than rebuilds) cannot
  // rebuild: every rank of the node sees the same, so nobody asks.
  if (rebuilt_ || !options_.rebuild_buckets || !daemon_can_rebuild_ ||
      recorder_->last().empty()) {
    return false;
  }
  const uint64_t it = iteration_.load(std::memory_order_relaxed);
  for (int i = 0; i < num_params(); ++i) {
    if (marked_[i].load(std::memory_order_acquire) == it) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RebuildBuckets called inside iteration ", it, " (parameter '",
          params_[i].name, "' already marked ready; ", Who(),
          "): call it between WaitAll and the next MarkReady"));
    }
  }
  RebuildCall call;
  call.job_id = options_.job_id;
  call.local_rank = options_.local_rank;
  call.session_id = session_id_;
  call.next_iteration = it;
  call.ready_order = recorder_->last();
  call.timeout = options_.attach_timeout;  // the call waits for every rank
  call.who = Who();
  call.names = &names_;
  call.dtypes = &dtypes_;
  call.bytes = &bytes_;
  call.base = static_cast<char*>(memory_.data());
  call.region_bytes = bucket_region_bytes_;
  if (device_ != nullptr) {
    call.device_base = device_->base();
    call.device_bytes = device_->size();
  }
  // Any failure is the job's too (the daemon failed it, or it sent what we
  // cannot use): this client is done.
  absl::StatusOr<PlanViews> views = RequestRebuild(*stub_, call);
  if (!views.ok()) return Fail(views.status());
  GradientPlaces now;
  for (const ParamSlot& p : params_) {
    now.data.push_back(p.data);
    now.on_device.push_back(buckets_[p.bucket].device != 0);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].device != 0) now.device_buckets.push_back(b);
  }
  // Every gradient keeps its contents (the last average, which the trainer
  // may go on accumulating into), as DDP copies grads into its new bucket
  // views; CUDA ones through the device (a host sync, once per job).
  if (absl::Status s = MoveToPlan(now, *views, bytes_, device_.get(), Who());
      !s.ok()) {
    return Fail(std::move(s));
  }
  UsePlan(*std::move(views));
  rebuilt_ = true;
  recorder_->Stop();
  return true;
}

bool ClientImpl::BucketDone(int bucket) const {
  if (bucket < 0 || bucket >= num_buckets()) return false;
  return done_seq_[bucket].load(std::memory_order_acquire) >=
         iteration_.load(std::memory_order_relaxed);
}

absl::Status ClientImpl::Broadcast(void* data, size_t bytes, int root) {
  if (in_join()) {
    // Joined ranks take no part in broadcasts; JoinActive syncs.
    return absl::FailedPreconditionError(absl::StrCat(
        "Broadcast in join mode (", Who(),
        "); use JoinActive's sync, or broadcast after Join() returned"));
  }
  return BroadcastImpl(data, bytes, root);
}

absl::Status ClientImpl::AreaRound(CollectiveKind kind, int32_t dtype,
                                   int32_t op, uint64_t bytes, int32_t root) {
  const uint64_t k = ++broadcast_seq_;
  BroadcastSlot* slot = layout_.bcast(
      control_.data(), static_cast<uint32_t>(options_.local_rank));
  slot->root.store(root, std::memory_order_relaxed);
  slot->bytes.store(bytes, std::memory_order_relaxed);
  slot->kind.store(static_cast<int32_t>(kind), std::memory_order_relaxed);
  slot->dtype.store(dtype, std::memory_order_relaxed);
  slot->op.store(op, std::memory_order_relaxed);
  // Release: the daemon reading ready_seq == k sees the description and
  // the area's contents.
  slot->ready_seq.store(k, std::memory_order_release);
  RingDaemon(header_, me_, bell_.get());
  return Wait(
      [this, k] {
        return header_->bcast_done_seq.load(std::memory_order_acquire) >= k;
      },
      kind == CollectiveKind::kBroadcast
          ? absl::StrCat("broadcast ", k, " from rank ", root)
          : absl::StrCat(CollectiveKindName(static_cast<int32_t>(kind)),
                         " (collective round ", k, ")"));
}

absl::Status ClientImpl::Area::Usable(absl::string_view what) const {
  RETURN_IF_ERROR(client_->CheckFailed());
  if (client_->in_join()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " in join mode (", Who(),
                     "); only Broadcast (JoinActive's sync) runs there"));
  }
  return absl::OkStatus();
}

absl::Status ClientImpl::Detach() {
  if (detached_) return absl::OkStatus();
  detached_ = true;
  if (stub_ != nullptr) {
    v1::DetachRequest request;
    request.set_job_id(options_.job_id);
    request.set_local_rank(options_.local_rank);
    request.set_session_id(session_id_);
    v1::DetachResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kDetachDeadline);
    // Best effort: closing the session socket below says the same thing.
    (void)stub_->Detach(&context, request, &response);
  }
  session_.reset();
  Fail(absl::FailedPreconditionError(
           absl::StrCat("client detached from gradd (", Who(), ")")))
      .IgnoreError();
  return absl::OkStatus();
}

absl::Status ClientImpl::SetCommHook(const CommHookOptions& hook) {
  if (absl::Status s = CheckFailed(); !s.ok()) return s;
  RETURN_IF_ERROR(
      CheckClientString("comm_hook.name", hook.name, kMaxCommHookNameBytes));
  v1::CommHookSetRequest request;
  request.set_job_id(options_.job_id);
  request.set_local_rank(options_.local_rank);
  request.set_session_id(session_id_);
  *request.mutable_hook() = CommHookToProto(hook);
  v1::CommHookSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      After<std::chrono::system_clock>(options_.connect_timeout));
  const grpc::Status s = stub_->SetCommHook(&context, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return absl::OkStatus();
}

}  // namespace

namespace {

// The strings an attach sends (common/client_strings.h). The daemon
// refuses bad ones too; refusing here names the field before anything is
// sent.
absl::Status CheckAttachStrings(const ClientOptions& options,
                                const std::vector<ClientParam>& params) {
  RETURN_IF_ERROR(CheckClientString("job_id", options.job_id, kMaxJobIdBytes));
  RETURN_IF_ERROR(
      CheckClientString("node_id", options.node_id, kMaxNodeIdBytes));
  RETURN_IF_ERROR(CheckClientString("coordinator", options.coordinator,
                                    kMaxCoordinatorBytes));
  RETURN_IF_ERROR(CheckClientString("comm_hook.name", options.comm_hook.name,
                                    kMaxCommHookNameBytes));
  for (size_t i = 0; i < params.size(); ++i) {
    RETURN_IF_ERROR(CheckClientString(absl::StrCat("params[", i, "].name"),
                                      params[i].name, kMaxParamNameBytes));
  }
  return absl::OkStatus();
}

// The size of the rank's shared area for broadcasts and collectives.
size_t CollectiveAreaBytes(const ClientOptions& options, size_t num_params) {
  size_t collective = options.collective_bytes;
  if (collective == 0 && num_params == 0) collective = kDefaultCollectiveBytes;
  return std::max(options.broadcast_bytes, collective);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Attach(
    const ClientOptions& options, const std::vector<ClientParam>& params) {
  if (options.find_unused_parameters) {
    return AttachWithUsedMap(options, params);
  }
  return internal::AttachDirect(options, params);
}

namespace internal {

absl::StatusOr<std::unique_ptr<Client>> AttachDirect(
    const ClientOptions& given, const std::vector<ClientParam>& params) {
  ClientOptions options = given;
  RETURN_IF_ERROR(ApplyLauncherEnv(&options, ProcessEnv));
  if (const char* env = std::getenv("GRADD_HEARTBEAT_TIMEOUT_MS");
      env != nullptr && *env != '\0') {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(env, &ms) || ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GRADD_HEARTBEAT_TIMEOUT_MS='", env,
                       "' is not a positive number of milliseconds"));
    }
    options.heartbeat_timeout = std::chrono::milliseconds(ms);
  }
  RETURN_IF_ERROR(CheckAttachStrings(options, params));
  const std::string socket_path =
      options.socket_path.empty() ? ClientSocketPath() : options.socket_path;
  if (options.local_world_size < 1 || options.local_rank < 0) {
    // The daemon checks ranks too; these would not even index the layout.
    return absl::InvalidArgumentError(absl::StrCat(
        "local rank ", options.local_rank, " of local world size ",
        options.local_world_size, " is invalid (job '", options.job_id, "')"));
  }
  const Clock::time_point connect_deadline =
      After<Clock>(options.connect_timeout);

  ASSIGN_OR_RETURN(std::optional<uid_t> trusted_uid,
                   TrustedDaemonUid(options.daemon_uid));
  ASSIGN_OR_RETURN(UniqueFd session,
                   ConnectSession(socket_path, options.connect_timeout));
  ASSIGN_OR_RETURN(PeerIdentity daemon, SocketPeer(session.get()));
  RETURN_IF_ERROR(
      CheckDaemonPeer(daemon, SessionSocketPath(socket_path), trusted_uid));
  ASSIGN_OR_RETURN(
      ReceivedMessage hello_msg,
      ReceiveWithFds(session.get(), sizeof(SessionRefused), 0,
                     std::max(Left(connect_deadline), kFdsTimeout)));
  absl::StatusOr<SessionMessage> hello =
      DecodeSessionMessage(hello_msg.payload);
  if (hello.ok() && hello->kind == SessionMessageKind::kRefused) {
    return absl::Status(
        hello->refusal.code(),
        absl::StrCat("gradd at ", socket_path,
                     " refused this trainer: ", hello->refusal.message()));
  }
  if (!hello.ok() || hello->kind != SessionMessageKind::kHello) {
    return absl::InternalError(absl::StrCat(
        "unexpected greeting from ", SessionSocketPath(socket_path), " (",
        hello.ok() ? "not a hello" : hello.status().message(),
        "); is it a gradd daemon?"));
  }

  // The gRPC socket must be served by the same daemon: the Attach request
  // carries the job id and every parameter name.
  ASSIGN_OR_RETURN(PeerIdentity rpc_peer, ProbeStreamSocketPeer(socket_path));
  RETURN_IF_ERROR(CheckDaemonPeer(rpc_peer, socket_path, trusted_uid));
  if (rpc_peer.pid != daemon.pid) {
    return absl::PermissionDeniedError(
        absl::StrCat("gradd's sockets are served by two processes: ",
                     SessionSocketPath(socket_path), " by pid ", daemon.pid,
                     ", ", socket_path, " by pid ", rpc_peer.pid,
                     "; refusing to send the attach request"));
  }

  grpc::ChannelArguments args;
  // Plans for models with many parameters exceed gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path),
                                grpc::InsecureChannelCredentials(), args);
  const auto connect_left =
      std::max<std::chrono::milliseconds>(Left(connect_deadline), kFdsTimeout);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 connect_left)) {
    return absl::UnavailableError(absl::StrCat(
        "gradd at ", socket_path,
        " accepted the session but its gRPC endpoint unix:", socket_path,
        " did not become ready within ", connect_left.count(), " ms"));
  }
  std::unique_ptr<v1::Node::Stub> stub = v1::Node::NewStub(channel);

  v1::AttachRequest request;
  request.set_job_id(options.job_id);
  request.set_local_rank(options.local_rank);
  request.set_local_world_size(options.local_world_size);
  request.set_session_id(hello->session_id);
  request.set_bucket_cap_mb(options.bucket_cap_mb);
  request.set_first_bucket_cap_mb(options.first_bucket_cap_mb);
  // One area carries broadcasts and the other collectives: the larger of
  // the two sizes asked for (collectives.h's default for a collective-only
  // job).
  request.set_broadcast_bytes(CollectiveAreaBytes(options, params.size()));
  request.set_node_id(options.node_id);
  if (options.node_rank.has_value()) request.set_node_rank(*options.node_rank);
  request.set_num_nodes(options.num_nodes);
  request.set_coordinator(options.coordinator);
  *request.mutable_comm_hook() = CommHookToProto(options.comm_hook);
  bool cuda = false;
  for (const ClientParam& p : params) {
    v1::ParamSpec* spec = request.add_params();
    spec->set_name(p.name);
    for (int64_t d : p.shape) spec->add_shape(d);
    // Unchecked on purpose: the daemon validates and names bad dtypes and
    // devices.
    spec->set_dtype(static_cast<v1::DType>(p.dtype));
    spec->set_device(static_cast<v1::DeviceKind>(p.device));
    cuda = cuda || p.device == static_cast<int32_t>(v1::DEVICE_CUDA);
  }
  if (cuda) {
    absl::StatusOr<v1::CudaDevice> gpu =
        DeviceClient::Describe(options.cuda_device);
    if (!gpu.ok()) {
      return absl::Status(gpu.status().code(),
                          absl::StrCat("attach to gradd (job '", options.job_id,
                                       "', local rank ", options.local_rank,
                                       "): ", gpu.status().message()));
    }
    *request.mutable_cuda_device() = *std::move(gpu);
  }
  v1::AttachResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      After<std::chrono::system_clock>(options.attach_timeout));
  grpc::Status rpc = stub->Attach(&context, request, &response);
  if (!rpc.ok()) {
    absl::Status s = FromGrpcStatus(rpc);
    if (s.code() == absl::StatusCode::kDeadlineExceeded &&
        rpc.error_message() == "Deadline Exceeded") {
      // gRPC's own deadline beat the daemon's answer (which names the
      // missing ranks); say at least what we were waiting for.
      return absl::DeadlineExceededError(absl::StrCat(
          "attach to gradd at ", socket_path, " did not complete within ",
          "attach_timeout (", options.attach_timeout.count(),
          " ms): local rank ", options.local_rank, " of job '", options.job_id,
          "' waited for the other local ranks (local world ", "size ",
          options.local_world_size, ") to attach"));
    }
    return absl::Status(
        s.code(), absl::StrCat("attach to gradd at ", socket_path, " (job '",
                               options.job_id, "', local rank ",
                               options.local_rank, ") failed: ", s.message()));
  }

  ASSIGN_OR_RETURN(
      ReceivedMessage fds_msg,
      ReceiveWithFds(session.get(), sizeof(SessionFds), 5, kFdsTimeout));
  // A fifth fd, the rank's device memory, comes with CUDA buckets.
  const size_t expected_fds = response.device_memory_bytes() > 0 ? 5 : 4;
  absl::StatusOr<SessionMessage> fds_header =
      DecodeSessionMessage(fds_msg.payload);
  if (!fds_header.ok() || fds_header->kind != SessionMessageKind::kFds ||
      fds_msg.fds.size() != expected_fds) {
    return absl::InternalError(absl::StrCat(
        "gradd sent a malformed fd message (", fds_msg.payload.size(),
        " bytes, ", fds_msg.fds.size(), " fds)"));
  }
  if (fds_header->attach_id != response.attach_id()) {
    return absl::InternalError(absl::StrCat(
        "gradd's fd message does not match the attach (attach id ",
        fds_header->attach_id, ", expected ", response.attach_id(), ")"));
  }

  if (response.buckets_size() == 0 && !params.empty()) {
    return absl::InternalError("gradd returned a plan without buckets");
  }
  auto client = std::make_unique<ClientImpl>(
      options, socket_path,
      ControlLayout(static_cast<uint32_t>(options.local_world_size),
                    // Slots for any plan (bucket rebuild); older daemons
                    // size the block for the attach plan.
                    response.bucket_slots() > 0
                        ? response.bucket_slots()
                        : static_cast<uint32_t>(response.buckets_size())));
  client->SetConnection(std::move(session), hello->session_id, channel);
  if (expected_fds == 5) {
    absl::StatusOr<std::unique_ptr<DeviceClient>> device = DeviceClient::Import(
        options.cuda_device, std::move(fds_msg.fds[4]), response);
    if (!device.ok()) {
      return absl::Status(
          device.status().code(),
          absl::StrCat("job '", options.job_id, "', local rank ",
                       options.local_rank, ": importing the device memory ",
                       "gradd allocated failed: ", device.status().message()));
    }
    client->SetDevice(*std::move(device));
  }
  RETURN_IF_ERROR(client->Init(
      params, response, std::move(fds_msg.fds[0]), std::move(fds_msg.fds[1]),
      std::move(fds_msg.fds[2]), std::move(fds_msg.fds[3])));
  // The client detaches when it goes out of scope with this error.
  RETURN_IF_ERROR(
      CheckFormedWorld(options, client->world_size(), client->global_rank()));
  return std::unique_ptr<Client>(std::move(client));
}

}  // namespace internal
}  // namespace gradd
