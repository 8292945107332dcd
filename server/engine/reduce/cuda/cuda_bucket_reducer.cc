#include "server/engine/reduce/cuda/cuda_bucket_reducer.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/cuda/device_reduce.h"
#include "common/status_macros.h"
#include "server/engine/formation/cuda/nccl_job_platform.h"
#include "server/logging.h"

namespace gradd {

CudaBucketReducer::CudaBucketReducer(
    const DeviceJobSpec& spec, const cuda::CudaDriver* driver,
    std::unique_ptr<BucketReducerInterface> host)
    : job_id_(spec.job_id),
      world_(spec.local_world_size),
      node_rank_(spec.node_rank),
      num_nodes_(spec.num_nodes),
      divisor_(spec.world_size),
      timeout_(spec.collective_timeout),
      driver_(driver),
      host_(std::move(host)) {}

absl::StatusOr<std::unique_ptr<BucketReducerInterface>>
CudaBucketReducer::Create(const DeviceJobSpec& spec,
                          std::unique_ptr<BucketReducerInterface> host) {
  const std::string job = absl::StrCat("job '", spec.job_id, "'");
  ASSIGN_OR_RETURN(const cuda::CudaDriver* driver, cuda::CudaDriver::Get());
  if (spec.rank_devices.size() != static_cast<size_t>(spec.local_world_size)) {
    return absl::InternalError(absl::StrCat(job, ": no device per rank"));
  }
  std::unique_ptr<CudaBucketReducer> r(
      new CudaBucketReducer(spec, driver, std::move(host)));
  // Several nodes: NCCL between them when the formation connected it on
  // every node (nccl_job_setup.h), else every CUDA bucket is staged. The
  // setup's outcome is the same on every node, so all take the same path.
  NcclJobComms* between = nullptr;
  std::string staged_because;
  if (spec.num_nodes > 1) {
    const NcclJobSetup* setup = spec.nccl_between_nodes.get();
    if (setup == nullptr) {
      staged_because = "NCCL between the nodes was not set up";
    } else if (setup->comms == nullptr) {
      staged_because = setup->staged_because;
    } else {
      between = dynamic_cast<NcclJobComms*>(setup->comms.get());
      if (between == nullptr) {
        return absl::InternalError(absl::StrCat(
            job, ": the NCCL communicators between the nodes are not CUDA's"));
      }
    }
  }
  r->stage_all_ = spec.num_nodes > 1 && between == nullptr;
  // Groups in order of first appearance: the NCCL rank of a GPU is its
  // group's index, the same on every run of the same job.
  r->rank_group_.resize(spec.local_world_size);
  for (int k = 0; k < spec.local_world_size; ++k) {
    const int dev = spec.rank_devices[k];
    auto it = std::find_if(r->groups_.begin(), r->groups_.end(),
                           [dev](const Group& g) { return g.device == dev; });
    if (it == r->groups_.end()) {
      r->groups_.emplace_back();
      r->groups_.back().device = dev;
      it = r->groups_.end() - 1;
    }
    it->ranks.push_back(k);
    r->rank_group_[k] = static_cast<int>(it - r->groups_.begin());
  }
  for (const Group& g : r->groups_) {
    if (!r->stage_all_ &&
        g.ranks.size() > static_cast<size_t>(cuda::kMaxDeviceBuffers)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          job, ": ", g.ranks.size(), " ranks share device ", g.device,
          "; the device reducer takes at most ", cuda::kMaxDeviceBuffers));
    }
  }
  const size_t slots = std::max(spec.plan.buckets.size(), spec.params.size());
  // The largest bucket any plan can have, in the accumulator type.
  size_t acc_bytes = 0;
  for (const ParamInfo& p : spec.params) {
    if (p.device != DeviceKind::kCuda) continue;
    acc_bytes += p.numel() * DTypeSize(AccumulatorDType(p.dtype));
  }
  for (Group& g : r->groups_) {
    const std::string where = absl::StrCat(job, " device ", g.device);
    RETURN_IF_ERROR(cuda::UseDevice(*driver, g.device, where));
    ASSIGN_OR_RETURN(g.stream, cuda::CudaStream::Create(driver, where));
    for (size_t b = 0; b < slots; ++b) {
      const std::string at = absl::StrCat(where, " bucket slot ", b);
      ASSIGN_OR_RETURN(
          cuda::CudaEvent e,
          cuda::CudaEvent::Create(driver, /*interprocess=*/true, at));
      ASSIGN_OR_RETURN(std::string handle, e.IpcHandle(at));
      g.done.push_back(std::move(e));
      g.done_handles.push_back(std::move(handle));
      ASSIGN_OR_RETURN(
          cuda::CudaEvent copied,
          cuda::CudaEvent::Create(driver, /*interprocess=*/false, at));
      g.copied.push_back(std::move(copied));
    }
    if (!r->stage_all_ && (r->groups_.size() > 1 || between != nullptr) &&
        acc_bytes > 0) {
      if (spec.devices == nullptr) {
        return absl::InternalError(absl::StrCat(where, ": no allocator"));
      }
      ASSIGN_OR_RETURN(g.acc, spec.devices->Allocate(g.device, acc_bytes));
    }
  }
  r->ready_.resize(spec.local_world_size);
  r->ready_handles_.resize(spec.local_world_size);
  for (int k = 0; k < spec.local_world_size; ++k) {
    const int dev = spec.rank_devices[k];
    const std::string where = absl::StrCat(job, " rank ", k, " device ", dev);
    RETURN_IF_ERROR(cuda::UseDevice(*driver, dev, where));
    for (size_t b = 0; b < slots; ++b) {
      const std::string at = absl::StrCat(where, " bucket slot ", b);
      ASSIGN_OR_RETURN(cuda::CudaEvent e,
                       cuda::CudaEvent::Create(driver, true, at));
      ASSIGN_OR_RETURN(std::string handle, e.IpcHandle(at));
      r->ready_[k].push_back(std::move(e));
      r->ready_handles_[k].push_back(std::move(handle));
    }
  }
  HostStaging::Options staging;
  staging.job_id = spec.job_id;
  staging.local_world_size = spec.local_world_size;
  staging.copy_timeout = absl::FromChrono(spec.collective_timeout);
  r->staging_ = std::make_unique<HostStaging>(
      std::move(staging), static_cast<StagingDeviceInterface*>(r.get()),
      [p = r.get()](const BucketWork& work, Completion done) {
        absl::MutexLock lock(&p->host_mu_);
        p->host_->Start(work, std::move(done));
      });
  if (between != nullptr) {
    if (between->comms().size() != r->groups_.size()) {
      return absl::InternalError(
          absl::StrCat(job, ": ", between->comms().size(),
                       " NCCL communicators for ", r->groups_.size(), " GPUs"));
    }
    r->nccl_ = between->library();
    r->comms_ = &between->comms();
    r->between_nodes_ = spec.nccl_between_nodes;
    std::vector<bool> ordered;
    for (const Bucket& b : spec.plan.buckets) {
      ordered.push_back(b.device == DeviceKind::kCuda);
    }
    r->gate_.emplace(std::move(ordered));
    spdlog::info(
        "{} node rank {} of {}: CUDA buckets are reduced on the GPUs, NCCL "
        "between the nodes ({} local GPUs as NCCL ranks {}..{} of {})",
        job, spec.node_rank, spec.num_nodes, r->groups_.size(),
        spec.nccl_between_nodes->first_rank,
        spec.nccl_between_nodes->first_rank +
            static_cast<int>(r->groups_.size()) - 1,
        spec.nccl_between_nodes->world);
    r->watchdog_ = std::thread([p = r.get()] { p->Watch(); });
  } else if (r->stage_all_) {
    spdlog::info(
        "{} node rank {} of {} with CUDA parameters: its CUDA buckets are "
        "staged through pinned host memory and reduced by the host path "
        "(Gloo between the nodes), because {}",
        job, spec.node_rank, spec.num_nodes, staged_because);
  } else if (r->groups_.size() > 1) {
    absl::StatusOr<const nccl::NcclLibrary*> lib = nccl::NcclLibrary::Get();
    if (!lib.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(job, ": its ranks use ", r->groups_.size(),
                       " GPUs, which needs NCCL: ", lib.status().message()));
    }
    r->nccl_ = *lib;
    ncclUniqueId id;
    RETURN_IF_ERROR(nccl::NcclCheck(*r->nccl_, r->nccl_->ncclGetUniqueId(&id),
                                    absl::StrCat(job, ": ncclGetUniqueId")));
    std::vector<int> devices;
    for (const Group& g : r->groups_) devices.push_back(g.device);
    ASSIGN_OR_RETURN(nccl::NcclCommunicators comms,
                     nccl::NcclCommunicators::Create(
                         r->nccl_, driver, id, static_cast<int>(devices.size()),
                         /*first_rank=*/0, devices, job));
    r->own_comms_.emplace(std::move(comms));
    r->comms_ = &*r->own_comms_;
    r->watchdog_ = std::thread([p = r.get()] { p->Watch(); });
  }
  return std::unique_ptr<BucketReducerInterface>(std::move(r));
}

CudaBucketReducer::~CudaBucketReducer() {
  // No new host work, then the host reducer completes (or cancels) what it
  // holds -- its completions copy back through our streams, still alive.
  // Buckets held for plan order never reached the GPU: answered now.
  if (gate_.has_value()) {
    gate_->Cancel(absl::CancelledError(
        absl::StrCat("job '", job_id_, "' stopped before the bucket's turn")));
  }
  if (staging_ != nullptr) staging_->Stop();
  host_.reset();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  // Work still queued reads the ranks' memory, which the Job frees after
  // us, and the pinned staging buffers: let it drain (bounded: the
  // watchdog aborted anything stuck), then free the staging.
  for (Group& g : groups_) {
    if (g.stream.get() != nullptr &&
        cuda::UseDevice(*driver_, g.device, "shutdown").ok()) {
      driver_->cuStreamSynchronize(g.stream.get());
    }
  }
  staging_.reset();
}

std::string CudaBucketReducer::Where(int bucket) const {
  if (num_nodes_ > 1) {
    return absl::StrCat("job '", job_id_, "' node rank ", node_rank_,
                        " bucket ", bucket);
  }
  return absl::StrCat("job '", job_id_, "' bucket ", bucket);
}

void CudaBucketReducer::PassGate(const BucketWork& work) {
  if (gate_.has_value()) gate_->Arrive(work.iteration, work.bucket, nullptr);
}

bool CudaBucketReducer::Staged(const BucketWork& work) const {
  return stage_all_ || (hooked_ && !work.internal) || work.ranks != nullptr ||
         work.rank_buffers->size() != static_cast<size_t>(world_);
}

void CudaBucketReducer::Start(const BucketWork& work, Completion done) {
  if (work.device != DeviceKind::kCuda) {
    {
      absl::MutexLock lock(&host_mu_);
      host_->Start(work, std::move(done));
    }
    PassGate(work);
    return;
  }
  if (work.bucket < 0 ||
      static_cast<size_t>(work.bucket) >= groups_[0].done.size()) {
    std::move(done)(absl::InternalError(
        absl::StrCat(Where(work.bucket), ": no event slot")));
    return;
  }
  if (Staged(work)) {
    staging_->Start(work, std::move(done));
    PassGate(work);
    return;
  }
  if (!gate_.has_value()) {
    StartOnDevice(work, std::move(done));
    return;
  }
  // NCCL between nodes: in plan order (plan_order_gate.h).
  gate_->Arrive(
      work.iteration, work.bucket,
      [this, work, done = std::move(done)](absl::Status s) mutable {
        if (!s.ok()) {
          std::move(done)(absl::Status(
              s.code(), absl::StrCat(Where(work.bucket), ": ", s.message())));
          return;
        }
        StartOnDevice(work, std::move(done));
      });
}

void CudaBucketReducer::StartOnDevice(const BucketWork& work, Completion done) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool fused = comms_ == nullptr;
  absl::Status s = fused ? StartFused(work) : StartCollective(work);
  buckets_.fetch_add(1, std::memory_order_relaxed);
  enqueue_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count(),
                        std::memory_order_relaxed);
  if (!s.ok() || fused) {
    std::move(done)(std::move(s));
    return;
  }
  absl::MutexLock lock(&mu_);
  in_flight_.push_back(InFlight{work.bucket,
                                std::chrono::steady_clock::now() + timeout_,
                                std::move(done)});
}

absl::Status CudaBucketReducer::StartFused(const BucketWork& work) {
  Group& g = groups_[0];
  const std::string where =
      absl::StrCat(Where(work.bucket), " device ", g.device);
  RETURN_IF_ERROR(cuda::UseDevice(*driver_, g.device, where));
  for (int k = 0; k < world_; ++k) {
    RETURN_IF_ERROR(
        cuda::CuCheck(*driver_,
                      driver_->cuStreamWaitEvent(
                          g.stream.get(), ready_[k][work.bucket].get(), 0),
                      absl::StrCat(where, " rank ", k, ": cuStreamWaitEvent")));
  }
  const double divisor = work.divisor > 0 ? work.divisor : divisor_;
  RETURN_IF_ERROR(
      cuda::DeviceFusedAverage(work.dtype, work.rank_buffers->data(), world_,
                               work.count, divisor, g.stream.get(), where));
  return cuda::CuCheck(
      *driver_,
      driver_->cuEventRecord(g.done[work.bucket].get(), g.stream.get()),
      absl::StrCat(where, ": cuEventRecord"));
}

absl::Status CudaBucketReducer::StartCollective(const BucketWork& work) {
  const std::vector<void*>& buffers = *work.rank_buffers;
  ASSIGN_OR_RETURN(ncclDataType_t type, nccl::NcclType(work.dtype));
  // 1. Per GPU: wait for its ranks, sum their buckets into the accumulator.
  for (Group& g : groups_) {
    const std::string where =
        absl::StrCat(Where(work.bucket), " device ", g.device);
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, g.device, where));
    std::vector<const void*> srcs;
    for (int k : g.ranks) {
      RETURN_IF_ERROR(cuda::CuCheck(
          *driver_,
          driver_->cuStreamWaitEvent(g.stream.get(),
                                     ready_[k][work.bucket].get(), 0),
          absl::StrCat(where, " rank ", k, ": cuStreamWaitEvent")));
      srcs.push_back(buffers[k]);
    }
    RETURN_IF_ERROR(cuda::DeviceSumToAccumulator(
        work.dtype, srcs.data(), static_cast<int>(srcs.size()),
        reinterpret_cast<void*>(g.acc->address()), work.count, g.stream.get(),
        where));
  }
  // 2. One allreduce across the GPUs (this node's, and with NCCL between
  // nodes every node's), each driven as a rank of the group call on its
  // own stream.
  const std::string where = Where(work.bucket);
  RETURN_IF_ERROR(nccl::NcclCheck(*nccl_, nccl_->ncclGroupStart(),
                                  absl::StrCat(where, ": ncclGroupStart")));
  absl::Status issued;
  for (size_t i = 0; i < groups_.size() && issued.ok(); ++i) {
    Group& g = groups_[i];
    issued = cuda::UseDevice(*driver_, g.device, where);
    if (issued.ok()) {
      void* acc = reinterpret_cast<void*>(g.acc->address());
      ncclResult_t r = nccl_->ncclAllReduce(acc, acc, work.count, type, ncclSum,
                                            comms_->comm(static_cast<int>(i)),
                                            g.stream.get());
      if (r == ncclInProgress && comms_->nonblocking()) r = ncclSuccess;
      issued = nccl::NcclCheck(
          *nccl_, r,
          absl::StrCat(where, " device ", g.device, ": ncclAllReduce"));
    }
  }
  ncclResult_t end = nccl_->ncclGroupEnd();
  // Non-blocking communicators (between nodes) may still be enqueueing.
  const bool enqueueing = end == ncclInProgress && comms_->nonblocking();
  absl::Status ended = nccl::NcclCheck(*nccl_, enqueueing ? ncclSuccess : end,
                                       absl::StrCat(where, ": ncclGroupEnd"));
  RETURN_IF_ERROR(issued);
  RETURN_IF_ERROR(ended);
  if (enqueueing) {
    RETURN_IF_ERROR(comms_->WaitIssued(
        absl::Now() + absl::FromChrono(timeout_),
        absl::StrCat(where, ": enqueueing the NCCL allreduce")));
  }
  // 3. Per GPU: the average into every rank's bucket, then done.
  const double divisor = work.divisor > 0 ? work.divisor : divisor_;
  for (Group& g : groups_) {
    const std::string at = absl::StrCat(where, " device ", g.device);
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, g.device, at));
    std::vector<void*> outs;
    for (int k : g.ranks) outs.push_back(buffers[k]);
    RETURN_IF_ERROR(cuda::DeviceScatterFromAccumulator(
        work.dtype, reinterpret_cast<const void*>(g.acc->address()), divisor,
        outs.data(), static_cast<int>(outs.size()), work.count, g.stream.get(),
        at));
    RETURN_IF_ERROR(cuda::CuCheck(
        *driver_,
        driver_->cuEventRecord(g.done[work.bucket].get(), g.stream.get()),
        absl::StrCat(at, ": cuEventRecord")));
  }
  return absl::OkStatus();
}

// Several GPUs: completes buckets in order once every GPU's done event has
// fired; an NCCL error or the timeout aborts the communicators and fails
// the bucket (and with it the job), so nothing waits on a dead peer.
void CudaBucketReducer::Watch() {
  bool set_context = false;
  while (true) {
    std::optional<InFlight> head;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !in_flight_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(50));
      if (stop_ && in_flight_.empty()) return;
      if (in_flight_.empty()) continue;
      head.emplace(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
    if (!set_context) {
      set_context =
          cuda::UseDevice(*driver_, groups_[0].device, "watchdog").ok();
    }
    const std::string where = Where(head->bucket);
    absl::Status result;
    while (true) {
      bool all = true;
      for (Group& g : groups_) {
        const CUresult q = driver_->cuEventQuery(g.done[head->bucket].get());
        if (q == CUDA_ERROR_NOT_READY) {
          all = false;
        } else if (q != CUDA_SUCCESS) {
          result = cuda::CuCheck(
              *driver_, q,
              absl::StrCat(where, " device ", g.device, ": cuEventQuery"));
        }
      }
      if (result.ok()) result = comms_->AsyncError(where);
      if (!result.ok() || all) break;
      if (std::chrono::steady_clock::now() > head->deadline) {
        result = absl::DeadlineExceededError(
            absl::StrCat(where, ": the NCCL allreduce did not complete within ",
                         timeout_.count(),
                         " ms (collective timeout); communicators "
                         "aborted"));
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (!result.ok()) comms_->Abort();
    std::move(head->done)(std::move(result));
  }
}

void CudaBucketReducer::StartBroadcast(const BroadcastWork& work,
                                       Completion done) {
  absl::MutexLock lock(&host_mu_);
  host_->StartBroadcast(work, std::move(done));
}

void CudaBucketReducer::StartJoinRound(JoinRoundWork work,
                                       RoundCompletion done) {
  absl::MutexLock lock(&host_mu_);
  host_->StartJoinRound(std::move(work), std::move(done));
}

void CudaBucketReducer::StartAt(uint64_t first_iteration) {
  absl::MutexLock lock(&host_mu_);
  host_->StartAt(first_iteration);
}

void CudaBucketReducer::SetPartitionBytes(uint64_t first_iteration,
                                          size_t bytes) {
  absl::MutexLock lock(&host_mu_);
  host_->SetPartitionBytes(first_iteration, bytes);
}

void CudaBucketReducer::Replan(uint64_t first_iteration, int num_buckets) {
  // A failed drain breaks the staging: every later staged bucket fails
  // with this error (and with it the job), named.
  if (absl::Status s = staging_->Replan(); !s.ok()) {
    spdlog::error("job '{}': {}", job_id_, s.ToString());
  }
  // The new plan's devices are not known here: every bucket in the
  // sequence (CPU ones pass through PassGate, so this only orders more).
  // Every node does the same, so the sequences still match; and nothing
  // waits forever: every bucket of iteration i starts before any of
  // i + 1 is ready (each rank's WaitAll(i) saw all of i done first).
  if (gate_.has_value()) {
    gate_->Replan(first_iteration, std::vector<bool>(num_buckets, true));
  }
  absl::MutexLock lock(&host_mu_);
  host_->Replan(first_iteration, num_buckets);
}

absl::Status CudaBucketReducer::AgreeCommHook(const std::string& description) {
  absl::MutexLock lock(&host_mu_);
  return host_->AgreeCommHook(description);
}

std::vector<int> CudaBucketReducer::GroupsOf(
    absl::Span<const Copy> copies) const {
  std::vector<int> out;
  for (const Copy& c : copies) {
    const int g = rank_group_[c.rank];
    if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  }
  return out;
}

absl::StatusOr<void*> CudaBucketReducer::AllocateHost(
    int rank, size_t bytes, absl::string_view context) {
  const std::string where =
      absl::StrCat(context, " device ", groups_[rank_group_[rank]].device);
  RETURN_IF_ERROR(
      cuda::UseDevice(*driver_, groups_[rank_group_[rank]].device, where));
  void* p = nullptr;
  // Portable: pinned for every GPU's context, whichever stream copies.
  RETURN_IF_ERROR(cuda::CuCheck(
      *driver_, driver_->cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE),
      absl::StrCat(where, ": cuMemHostAlloc of ", bytes, " bytes")));
  return p;
}

void CudaBucketReducer::FreeHost(void* host) { driver_->cuMemFreeHost(host); }

absl::Status CudaBucketReducer::OnEachGroup(
    int bucket, absl::Span<const Copy> copies, absl::string_view context,
    absl::FunctionRef<absl::Status(const Group&, const Copy&,
                                   const std::string&)>
        per_copy,
    std::vector<cuda::CudaEvent> Group::*then_record) {
  for (int gi : GroupsOf(copies)) {
    Group& g = groups_[gi];
    const std::string where = absl::StrCat(context, " device ", g.device);
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, g.device, where));
    for (const Copy& c : copies) {
      if (rank_group_[c.rank] != gi) continue;
      RETURN_IF_ERROR(per_copy(
          g, c, absl::StrCat(context, " rank ", c.rank, " device ", g.device)));
    }
    RETURN_IF_ERROR(cuda::CuCheck(
        *driver_,
        driver_->cuEventRecord((g.*then_record)[bucket].get(), g.stream.get()),
        absl::StrCat(where, ": cuEventRecord")));
  }
  return absl::OkStatus();
}

absl::Status CudaBucketReducer::CopyToHost(int bucket,
                                           absl::Span<const Copy> copies,
                                           absl::string_view context) {
  return OnEachGroup(
      bucket, copies, context,
      [&](const Group& g, const Copy& c, const std::string& at) {
        RETURN_IF_ERROR(
            cuda::CuCheck(*driver_,
                          driver_->cuStreamWaitEvent(
                              g.stream.get(), ready_[c.rank][bucket].get(), 0),
                          absl::StrCat(at, ": cuStreamWaitEvent")));
        return cuda::CuCheck(
            *driver_,
            driver_->cuMemcpyDtoHAsync(c.host,
                                       reinterpret_cast<CUdeviceptr>(c.device),
                                       c.bytes, g.stream.get()),
            absl::StrCat(at, ": cuMemcpyDtoHAsync"));
      },
      &Group::copied);
}

absl::Status CudaBucketReducer::WaitForHost(int bucket,
                                            absl::Span<const Copy> copies,
                                            absl::Time deadline,
                                            absl::string_view context) {
  for (int gi : GroupsOf(copies)) {
    Group& g = groups_[gi];
    const std::string where = absl::StrCat(context, " device ", g.device);
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, g.device, where));
    RETURN_IF_ERROR(PollEvent(g.copied[bucket].get(), deadline, where,
                              "the copy of the bucket to host staging"));
  }
  return absl::OkStatus();
}

absl::Status CudaBucketReducer::PollEvent(CUevent event, absl::Time deadline,
                                          const std::string& where,
                                          absl::string_view what) {
  absl::Duration nap = absl::Microseconds(10);
  while (true) {
    const CUresult q = driver_->cuEventQuery(event);
    if (q == CUDA_SUCCESS) return absl::OkStatus();
    if (q != CUDA_ERROR_NOT_READY) {
      return cuda::CuCheck(*driver_, q, absl::StrCat(where, ": ", what));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": ", what, " did not finish within the collective timeout (",
          timeout_.count(), " ms)"));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

absl::Status CudaBucketReducer::CopyToDevice(int bucket,
                                             absl::Span<const Copy> copies,
                                             absl::string_view context) {
  return OnEachGroup(
      bucket, copies, context,
      [&](const Group& g, const Copy& c, const std::string& at) {
        return cuda::CuCheck(
            *driver_,
            driver_->cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(c.device),
                                       c.host, c.bytes, g.stream.get()),
            absl::StrCat(at, ": cuMemcpyHtoDAsync"));
      },
      &Group::done);
}

absl::Status CudaBucketReducer::Drain(absl::Time deadline,
                                      absl::string_view context) {
  // Once per plan switch: an event recorded on each daemon stream after
  // everything queued there, polled (bounded).
  for (Group& g : groups_) {
    const std::string where = absl::StrCat(context, " device ", g.device);
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, g.device, where));
    ASSIGN_OR_RETURN(
        cuda::CudaEvent drained,
        cuda::CudaEvent::Create(driver_, /*interprocess=*/false, where));
    RETURN_IF_ERROR(cuda::CuCheck(
        *driver_, driver_->cuEventRecord(drained.get(), g.stream.get()),
        absl::StrCat(where, ": cuEventRecord")));
    RETURN_IF_ERROR(PollEvent(drained.get(), deadline, where,
                              "the copies back from host staging"));
  }
  return absl::OkStatus();
}

ReducerStats CudaBucketReducer::stats() const {
  ReducerStats s = host_ != nullptr ? host_->stats() : ReducerStats();
  s.buckets += buckets_.load(std::memory_order_relaxed);
  s.local_reduce_ns += enqueue_ns_.load(std::memory_order_relaxed);
  return s;
}

absl::Status CudaBucketReducer::SetCommHook(
    std::unique_ptr<CommHookInterface> hook) {
  const bool hooked = hook != nullptr;
  absl::MutexLock lock(&host_mu_);
  RETURN_IF_ERROR(host_->SetCommHook(std::move(hook)));
  hooked_ = hooked;
  return absl::OkStatus();
}

void CudaBucketReducer::DescribeDevice(int rank,
                                       v1::AttachResponse* response) const {
  if (rank < 0 || rank >= world_) return;
  for (const std::string& h : ready_handles_[rank]) {
    response->add_ready_events(h);
  }
  for (const std::string& h : groups_[rank_group_[rank]].done_handles) {
    response->add_done_events(h);
  }
}

}  // namespace gradd
