// NCCL, loaded at run time (dlopen("libnccl.so.2")), so the daemon starts
// and serves CPU and single-GPU jobs on machines without it; and the
// job's communicators over it.
//
//   NcclLibrary::Get()   the process-wide table, or FAILED_PRECONDITION
//                        naming the library and why it did not load;
//   NcclCheck            an ncclResult_t as an absl::Status with context
//                        (job, device, bucket) and ncclGetErrorString's text;
//   NcclCommunicators    one communicator per local GPU of a job, created
//                        in one group call (one process drives several
//                        GPUs as ranks); Abort() tears them down without
//                        waiting (a dead peer, a stuck collective). Between
//                        nodes (a finite `timeout`) they are non-blocking:
//                        creation is polled and aborted when the timeout
//                        passes, and after a group call that answers
//                        ncclInProgress WaitIssued polls until NCCL has
//                        enqueued it.
// Thread-compatible; Abort may be called from any thread.
#ifndef GRADD_SERVER_BACKENDS_NCCL_NCCL_LIBRARY_H_
#define GRADD_SERVER_BACKENDS_NCCL_NCCL_LIBRARY_H_

#include <nccl.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/cuda/driver.h"
#include "common/dtype.h"

namespace gradd::nccl {

struct NcclLibrary {
  int version = 0;  // ncclGetVersion, e.g. 22703
#define GRADD_NCCL_FN(name) decltype(&::name) name = nullptr;
  GRADD_NCCL_FN(ncclGetVersion)
  GRADD_NCCL_FN(ncclGetUniqueId)
  GRADD_NCCL_FN(ncclCommInitRank)
  GRADD_NCCL_FN(ncclCommDestroy)
  GRADD_NCCL_FN(ncclCommAbort)
  GRADD_NCCL_FN(ncclCommGetAsyncError)
  GRADD_NCCL_FN(ncclGetErrorString)
  GRADD_NCCL_FN(ncclAllReduce)
  GRADD_NCCL_FN(ncclBroadcast)
  GRADD_NCCL_FN(ncclGroupStart)
  GRADD_NCCL_FN(ncclGroupEnd)
#undef GRADD_NCCL_FN
  // NCCL 2.14 and later; null before (then no non-blocking communicators).
  decltype(&::ncclCommInitRankConfig) ncclCommInitRankConfig = nullptr;

  static absl::StatusOr<const NcclLibrary*> Get();
  // Not cached; tests pass a missing path.
  static absl::StatusOr<NcclLibrary> Load(const char* library);
};

absl::Status NcclCheck(const NcclLibrary& nccl, ncclResult_t result,
                       absl::string_view context);

// float32 / float64 (the accumulator types: 16-bit gradients are summed in
// float32 on the wire).
absl::StatusOr<ncclDataType_t> NcclType(DType dtype);

class NcclCommunicators {
 public:
  NcclCommunicators() = default;
  // Ranks first_rank .. first_rank + devices.size() - 1 of `world` NCCL
  // ranks, one per entry of `devices` (daemon ordinals), all created in one
  // group call. `id` from ncclGetUniqueId on one participant, shared by all
  // (the rendezvous store between nodes). A finite `timeout`: non-blocking
  // communicators, DEADLINE_EXCEEDED (and aborted) when they are not ready
  // within it; infinite: blocking ones (every rank in this process).
  static absl::StatusOr<NcclCommunicators> Create(
      const NcclLibrary* nccl, const cuda::CudaDriver* driver,
      const ncclUniqueId& id, int world, int first_rank,
      const std::vector<int>& devices, absl::string_view context,
      absl::Duration timeout = absl::InfiniteDuration());
  NcclCommunicators(NcclCommunicators&&) noexcept;
  NcclCommunicators& operator=(NcclCommunicators&&) noexcept;
  ~NcclCommunicators();  // destroys (or aborts, after Abort) the comms

  ncclComm_t comm(int i) const { return comms_[i]; }
  size_t size() const { return comms_.size(); }
  bool nonblocking() const { return nonblocking_; }
  // The first asynchronous error of any communicator (OK if none);
  // ABORTED once Abort ran.
  absl::Status AsyncError(absl::string_view context) const;
  // Non-blocking communicators: waits until no communicator is in
  // progress any more (the last group call was enqueued, or creation
  // finished); DEADLINE_EXCEEDED past `deadline`, NCCL's error otherwise.
  absl::Status WaitIssued(absl::Time deadline, absl::string_view context) const;
  // ncclCommAbort on every communicator: pending collectives end, the
  // communicators become unusable.
  void Abort();

 private:
  void Release();
  const NcclLibrary* nccl_ = nullptr;
  std::vector<ncclComm_t> comms_;
  // Set by Abort (the watchdog thread); read before touching comms_.
  std::atomic<bool> aborted_{false};
  bool nonblocking_ = false;
};

}  // namespace gradd::nccl

#endif  // GRADD_SERVER_BACKENDS_NCCL_NCCL_LIBRARY_H_
