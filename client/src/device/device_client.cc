#include "client/src/device/device_client.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#if GRADD_HAVE_CUDA
#include "common/cuda/cumem_allocator.h"
#include "common/cuda/driver.h"
#include "common/cuda/owners.h"
#endif

namespace gradd {
namespace {

// GRADD_FAKE_GPU_UUID as 16 bytes, or "" when unset.
absl::StatusOr<std::string> FakeUuid() {
  const char* env = std::getenv("GRADD_FAKE_GPU_UUID");
  if (env == nullptr || *env == '\0') return std::string();
  const std::string hex = env;
  if (hex.size() != 32 ||
      !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GRADD_FAKE_GPU_UUID='", hex, "' is not 32 hex digits"));
  }
  return absl::HexStringToBytes(hex);
}

class FakeDeviceClient final : public DeviceClient {
 public:
  explicit FakeDeviceClient(Mapping mapping) : mapping_(std::move(mapping)) {}
  char* base() const override { return static_cast<char*>(mapping_.data()); }
  size_t size() const override { return mapping_.size(); }
  absl::Status RecordReady(int, void*) override { return absl::OkStatus(); }
  absl::Status WaitDone(int, void*) override { return absl::OkStatus(); }
  // The fake's "device" is host memory, but it goes through the same
  // snapshot as the real one, so the tests run the real move logic.
  absl::Status MoveGradients(const std::vector<RegionMove>& moves,
                             const std::vector<int>&,
                             absl::string_view) override {
    char* base = this->base();
    return MoveThroughSnapshot(
        moves,
        [base](uint64_t offset, uint64_t bytes, void* host) {
          std::memcpy(host, base + offset, bytes);
          return absl::OkStatus();
        },
        [base](const void* host, uint64_t offset, uint64_t bytes) {
          std::memcpy(base + offset, host, bytes);
          return absl::OkStatus();
        },
        [] { return absl::OkStatus(); });
  }

 private:
  Mapping mapping_;
};

#if GRADD_HAVE_CUDA
class CudaDeviceClient final : public DeviceClient {
 public:
  CudaDeviceClient(const cuda::CudaDriver* driver, int ordinal,
                   cuda::ImportedDeviceMemory memory)
      : driver_(driver), ordinal_(ordinal), memory_(std::move(memory)) {}

  absl::Status Open(const v1::AttachResponse& response) {
    const std::string where = absl::StrCat("cuda:", ordinal_);
    for (int b = 0; b < response.ready_events_size(); ++b) {
      ASSIGN_OR_RETURN(
          cuda::CudaEvent e,
          cuda::CudaEvent::Open(driver_, response.ready_events(b),
                                absl::StrCat(where, " ready event ", b)));
      ready_.push_back(std::move(e));
    }
    for (int b = 0; b < response.done_events_size(); ++b) {
      ASSIGN_OR_RETURN(
          cuda::CudaEvent e,
          cuda::CudaEvent::Open(driver_, response.done_events(b),
                                absl::StrCat(where, " done event ", b)));
      done_.push_back(std::move(e));
    }
    return absl::OkStatus();
  }

  char* base() const override {
    return reinterpret_cast<char*>(memory_.address());
  }
  size_t size() const override { return memory_.size(); }

  absl::Status RecordReady(int bucket, void* stream) override {
    const std::string where =
        absl::StrCat("cuda:", ordinal_, " bucket ", bucket);
    if (bucket < 0 || static_cast<size_t>(bucket) >= ready_.size()) {
      return absl::InternalError(absl::StrCat(where, ": no ready event"));
    }
    // The calling thread may not have made the device current (autograd
    // threads do; plain C++ trainers may not).
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, ordinal_, where));
    return cuda::CuCheck(*driver_,
                         driver_->cuEventRecord(ready_[bucket].get(),
                                                static_cast<CUstream>(stream)),
                         absl::StrCat(where, ": cuEventRecord"));
  }

  absl::Status WaitDone(int bucket, void* stream) override {
    const std::string where =
        absl::StrCat("cuda:", ordinal_, " bucket ", bucket);
    if (bucket < 0 || static_cast<size_t>(bucket) >= done_.size()) {
      return absl::InternalError(absl::StrCat(where, ": no done event"));
    }
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, ordinal_, where));
    return cuda::CuCheck(
        *driver_,
        driver_->cuStreamWaitEvent(static_cast<CUstream>(stream),
                                   done_[bucket].get(), 0),
        absl::StrCat(where, ": cuStreamWaitEvent"));
  }

  absl::Status MoveGradients(const std::vector<RegionMove>& moves,
                             const std::vector<int>& done_buckets,
                             absl::string_view who) override {
    const std::string where =
        absl::StrCat(who, " device cuda:", ordinal_, ": bucket rebuild");
    if (moves.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(cuda::UseDevice(*driver_, ordinal_, where));
    // 1. The daemon's last reduce into these buckets has finished (its
    // stream recorded done after writing them).
    for (int b : done_buckets) {
      if (b < 0 || static_cast<size_t>(b) >= done_.size()) {
        return absl::InternalError(
            absl::StrCat(where, ": no done event for bucket ", b));
      }
      RETURN_IF_ERROR(cuda::CuCheck(
          *driver_, driver_->cuEventSynchronize(done_[b].get()),
          absl::StrCat(where, ": cuEventSynchronize(done event of bucket ", b,
                       ")")));
    }
    // 2. So has everything this process queued on the device (the
    // trainer's streams, whichever they are).
    RETURN_IF_ERROR(cuda::CuCheck(*driver_, driver_->cuCtxSynchronize(),
                                  absl::StrCat(where, ": cuCtxSynchronize")));
    // 3. The moves, on a stream of our own; MoveThroughSnapshot syncs it
    // before reading the snapshot and before freeing it.
    ASSIGN_OR_RETURN(cuda::CudaStream stream,
                     cuda::CudaStream::Create(driver_, where));
    const CUdeviceptr base = memory_.address();
    const CUstream s = stream.get();
    return MoveThroughSnapshot(
        moves,
        [&](uint64_t offset, uint64_t bytes, void* host) {
          return cuda::CuCheck(
              *driver_,
              driver_->cuMemcpyDtoHAsync(host, base + offset, bytes, s),
              absl::StrCat(where, ": cuMemcpyDtoHAsync of ", bytes,
                           " bytes at offset ", offset));
        },
        [&](const void* host, uint64_t offset, uint64_t bytes) {
          return cuda::CuCheck(
              *driver_,
              driver_->cuMemcpyHtoDAsync(base + offset, host, bytes, s),
              absl::StrCat(where, ": cuMemcpyHtoDAsync of ", bytes,
                           " bytes to offset ", offset));
        },
        [&] {
          return cuda::CuCheck(*driver_, driver_->cuStreamSynchronize(s),
                               absl::StrCat(where, ": cuStreamSynchronize"));
        });
  }

 private:
  const cuda::CudaDriver* driver_;
  int ordinal_;
  // Events before memory in destruction: nothing queued may outlive the
  // mapping it reads (the daemon's events only order, they read nothing).
  cuda::ImportedDeviceMemory memory_;
  std::vector<cuda::CudaEvent> ready_;
  std::vector<cuda::CudaEvent> done_;
};
#endif

}  // namespace

absl::StatusOr<v1::CudaDevice> DeviceClient::Describe(int ordinal) {
  if (ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA parameters need the rank's GPU (ClientOptions::cuda_device); "
        "got ",
        ordinal));
  }
  v1::CudaDevice out;
  out.set_ordinal(ordinal);
  ASSIGN_OR_RETURN(std::string fake, FakeUuid());
  if (!fake.empty()) {
    out.set_uuid(fake);
    return out;
  }
#if GRADD_HAVE_CUDA
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  const std::string where = absl::StrCat("cuda:", ordinal);
  CUdevice dev = 0;
  RETURN_IF_ERROR(cuda::CuCheck(*d, d->cuDeviceGet(&dev, ordinal),
                                absl::StrCat(where, ": cuDeviceGet")));
  CUuuid uuid;
  RETURN_IF_ERROR(cuda::CuCheck(*d, d->cuDeviceGetUuid(&uuid, dev),
                                absl::StrCat(where, ": cuDeviceGetUuid")));
  out.set_uuid(std::string(uuid.bytes, sizeof(uuid.bytes)));
  out.set_driver_version(d->version);
  return out;
#else
  return absl::FailedPreconditionError(
      "CUDA parameters, but this gradd client library was built without CUDA");
#endif
}

absl::StatusOr<std::unique_ptr<DeviceClient>> DeviceClient::Import(
    int ordinal, UniqueFd fd, const v1::AttachResponse& response) {
  const size_t bytes = response.device_memory_bytes();
  ASSIGN_OR_RETURN(std::string fake, FakeUuid());
  if (!fake.empty()) {
    ASSIGN_OR_RETURN(Mapping m, Mapping::Map(fd.get(), bytes));
    return std::unique_ptr<DeviceClient>(new FakeDeviceClient(std::move(m)));
  }
#if GRADD_HAVE_CUDA
  ASSIGN_OR_RETURN(const cuda::CudaDriver* d, cuda::CudaDriver::Get());
  // The daemon's allocation is rounded to its granularity; map what it
  // exported (at least the bytes the plan needs).
  ASSIGN_OR_RETURN(
      cuda::ImportedDeviceMemory memory,
      cuda::ImportedDeviceMemory::Import(d, std::move(fd), ordinal, bytes));
  auto client =
      std::make_unique<CudaDeviceClient>(d, ordinal, std::move(memory));
  RETURN_IF_ERROR(client->Open(response));
  return std::unique_ptr<DeviceClient>(std::move(client));
#else
  return absl::FailedPreconditionError(
      "CUDA parameters, but this gradd client library was built without CUDA");
#endif
}

}  // namespace gradd
