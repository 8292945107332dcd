// ClientImpl (client_impl.h): Init, the data path (MarkReady, WaitAll), the
// client's failure state, Detach and SetCommHook.
#include "client/src/data/client_impl.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/src/data/comm_hook_options.h"
#include "common/client_strings.h"
#include "common/dtype.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace gradd {

// The public constants (client.h, gradd.h) are the internal DType values.
static_assert(dtype::kFloat32 == static_cast<int32_t>(DType::kFloat32));
static_assert(dtype::kFloat64 == static_cast<int32_t>(DType::kFloat64));
static_assert(dtype::kFloat16 == static_cast<int32_t>(DType::kFloat16));
static_assert(dtype::kBFloat16 == static_cast<int32_t>(DType::kBFloat16));

namespace internal {
namespace {

constexpr std::chrono::milliseconds kDetachDeadline{1000};
// How many unmarked parameters an error message names.
constexpr size_t kNamedInErrors = 5;

}  // namespace

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
  min_nodes_ = response.min_nodes();
  JoinClient::Hooks hooks;
  hooks.wait = [this](const std::function<bool()>& ready,
                      const std::string& what) { return Wait(ready, what); };
  hooks.broadcast = [this](void* data, size_t bytes, int root) {
    return BroadcastImpl(data, bytes, root);
  };
  // A restarted rank's JoinSlot was cleared by the daemon: the JoinClient
  // reads epoch 0 from it, as for a new job.
  join_ = std::make_unique<JoinClient>(layout_, control_.data(),
                                       options_.local_rank, bell_.get(),
                                       global_rank_, Who(), std::move(hooks));
  restart_.Attach(header_, response.restarted(),
                  response.rank_restart_grace_ms(), response.sync_seq());
  if (response.restarted()) {
    // Rank restart: the running job's next iteration and collective round
    // (the daemon already moved this rank's rows there). No rebuild: the
    // plan just received is the job's current one, and the ranks that
    // stayed will not ask for another.
    if (response.next_iteration() < 1) {
      return bad("restarted at iteration 0");
    }
    iteration_.store(response.next_iteration(), std::memory_order_release);
    broadcast_seq_ = response.collective_seq();
    rebuilt_ = true;
    recorder_->Stop();
  }
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
  restart_.NoteMarkReady();
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
  // Rank restart: the daemon marked every bucket done without averaging
  // (common/control_block.h). The iteration is over all the same (the next
  // one is it + 1 on every rank); the caller skips its step. The wait makes
  // sure the re-attach's sync_seq bump is visible, so that StateSyncPending
  // says the same here as on every other rank.
  if (restart_.IterationAborted(it)) {
    RETURN_IF_ERROR(
        Wait([this, it] { return restart_.IterationAbortSettled(it); },
             absl::StrCat("the re-attach that aborted iteration ", it)));
    return restart_.IterationAbortedError(it, options_.job_id);
  }
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

bool ClientImpl::BucketDone(int bucket) const {
  if (bucket < 0 || bucket >= num_buckets()) return false;
  return done_seq_[bucket].load(std::memory_order_acquire) >=
         iteration_.load(std::memory_order_relaxed);
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

}  // namespace internal
}  // namespace gradd
