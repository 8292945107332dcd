#include "server/backends/nccl/nccl_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cuda/owners.h"
#include "common/status_macros.h"

namespace gradd::nccl {

absl::StatusOr<NcclLibrary> NcclLibrary::Load(const char* library) {
  void* handle = ::dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL is not available: cannot load ", library, " (",
                     why != nullptr ? why : "unknown error",
                     "); jobs whose ranks use several GPUs or nodes need it"));
  }
  NcclLibrary lib;
  std::string missing;
#define GRADD_NCCL_FN(name)                                                \
  lib.name = reinterpret_cast<decltype(lib.name)>(::dlsym(handle, #name)); \
  if (lib.name == nullptr)                                                 \
    absl::StrAppend(&missing, missing.empty() ? "" : ", ", #name);
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
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(library, " lacks ", missing));
  }
  lib.ncclCommInitRankConfig =
      reinterpret_cast<decltype(lib.ncclCommInitRankConfig)>(
          ::dlsym(handle, "ncclCommInitRankConfig"));
  lib.ncclGetVersion(&lib.version);
  return lib;
}

absl::StatusOr<const NcclLibrary*> NcclLibrary::Get() {
  static const absl::StatusOr<NcclLibrary>* loaded =
      new absl::StatusOr<NcclLibrary>(Load("libnccl.so.2"));
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

absl::Status NcclCheck(const NcclLibrary& nccl, ncclResult_t result,
                       absl::string_view context) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* text = nccl.ncclGetErrorString != nullptr
                         ? nccl.ncclGetErrorString(result)
                         : nullptr;
  // A peer that went away or a network failure: the job cannot go on, but
  // the daemon can; usage errors are ours.
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (result == ncclSystemError || result == ncclRemoteError) {
    code = absl::StatusCode::kUnavailable;
  } else if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    code = absl::StatusCode::kInvalidArgument;
  }
  return absl::Status(
      code, absl::StrCat(context, ": NCCL error ", static_cast<int>(result),
                         text != nullptr ? absl::StrCat(" (", text, ")") : ""));
}

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (AccumulatorDType(dtype)) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("no NCCL type for ", std::string(DTypeName(dtype))));
  }
}

absl::StatusOr<NcclCommunicators> NcclCommunicators::Create(
    const NcclLibrary* nccl, const cuda::CudaDriver* driver,
    const ncclUniqueId& id, int world, int first_rank,
    const std::vector<int>& devices, absl::string_view context,
    absl::Duration timeout) {
  NcclCommunicators out;
  out.nccl_ = nccl;
  out.comms_.assign(devices.size(), nullptr);
  out.nonblocking_ = timeout != absl::InfiniteDuration();
  if (out.nonblocking_ && nccl->ncclCommInitRankConfig == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        context, ": NCCL ", nccl->version,
        " has no ncclCommInitRankConfig (non-blocking communicators need "
        "NCCL 2.14 or later)"));
  }
  const absl::Time deadline = absl::Now() + timeout;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  RETURN_IF_ERROR(NcclCheck(*nccl, nccl->ncclGroupStart(),
                            absl::StrCat(context, ": ncclGroupStart")));
  absl::Status first_error;
  for (size_t i = 0; i < devices.size(); ++i) {
    const std::string where =
        absl::StrCat(context, " device ", devices[i], " (NCCL rank ",
                     first_rank + static_cast<int>(i), " of ", world, ")");
    absl::Status s = cuda::UseDevice(*driver, devices[i], where);
    const int rank = first_rank + static_cast<int>(i);
    if (s.ok()) {
      ncclResult_t r =
          out.nonblocking_
              ? nccl->ncclCommInitRankConfig(&out.comms_[i], world, id, rank,
                                             &config)
              : nccl->ncclCommInitRank(&out.comms_[i], world, id, rank);
      if (out.nonblocking_ && r == ncclInProgress) r = ncclSuccess;
      s = NcclCheck(*nccl, r, absl::StrCat(where, ": ncclCommInitRank"));
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  ncclResult_t ended = nccl->ncclGroupEnd();
  if (out.nonblocking_ && ended == ncclInProgress) ended = ncclSuccess;
  absl::Status end =
      NcclCheck(*nccl, ended, absl::StrCat(context, ": ncclGroupEnd"));
  if (first_error.ok()) first_error = end;
  if (first_error.ok() && out.nonblocking_) {
    first_error = out.WaitIssued(
        deadline, absl::StrCat(context, ": creating the NCCL communicators"));
  }
  if (!first_error.ok()) {
    out.Abort();
    return first_error;
  }
  return out;
}

NcclCommunicators::NcclCommunicators(NcclCommunicators&& o) noexcept
    : nccl_(o.nccl_),
      comms_(std::move(o.comms_)),
      aborted_(o.aborted_.exchange(false)),
      nonblocking_(o.nonblocking_) {
  o.comms_.clear();
}

NcclCommunicators& NcclCommunicators::operator=(
    NcclCommunicators&& o) noexcept {
  if (this != &o) {
    Release();
    nccl_ = o.nccl_;
    comms_ = std::move(o.comms_);
    o.comms_.clear();
    aborted_ = o.aborted_.exchange(false);
    nonblocking_ = o.nonblocking_;
  }
  return *this;
}

NcclCommunicators::~NcclCommunicators() { Release(); }

void NcclCommunicators::Release() {
  // After Abort the communicators are freed already. Non-blocking ones
  // (between nodes) are aborted rather than destroyed: destroying waits
  // for peers, which may be gone, and the reducer has drained its work.
  if (!aborted_ && nonblocking_) {
    Abort();
  } else if (!aborted_) {
    for (ncclComm_t c : comms_) {
      if (c != nullptr) nccl_->ncclCommDestroy(c);
    }
  }
  comms_.clear();
}

absl::Status NcclCommunicators::AsyncError(absl::string_view context) const {
  if (aborted_) {
    return absl::AbortedError(
        absl::StrCat(context, ": the NCCL communicators were aborted"));
  }
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (comms_[i] == nullptr) continue;
    ncclResult_t async = ncclSuccess;
    RETURN_IF_ERROR(
        NcclCheck(*nccl_, nccl_->ncclCommGetAsyncError(comms_[i], &async),
                  absl::StrCat(context, ": ncclCommGetAsyncError")));
    if (async != ncclSuccess && async != ncclInProgress) {
      return NcclCheck(*nccl_, async,
                       absl::StrCat(context, " communicator ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCommunicators::WaitIssued(absl::Time deadline,
                                           absl::string_view context) const {
  absl::Duration nap = absl::Microseconds(5);
  for (size_t i = 0; i < comms_.size(); ++i) {
    if (comms_[i] == nullptr) continue;
    while (true) {
      if (aborted_) {
        return absl::AbortedError(
            absl::StrCat(context, ": the NCCL communicators were aborted"));
      }
      ncclResult_t state = ncclSuccess;
      RETURN_IF_ERROR(
          NcclCheck(*nccl_, nccl_->ncclCommGetAsyncError(comms_[i], &state),
                    absl::StrCat(context, ": ncclCommGetAsyncError")));
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        return NcclCheck(*nccl_, state,
                         absl::StrCat(context, " communicator ", i));
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            context, ": communicator ", i,
            " still in progress at the deadline (a peer did not arrive)"));
      }
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }
  return absl::OkStatus();
}

void NcclCommunicators::Abort() {
  if (aborted_.exchange(true)) return;
  for (ncclComm_t c : comms_) {
    if (c != nullptr) nccl_->ncclCommAbort(c);
  }
}

}  // namespace gradd::nccl
