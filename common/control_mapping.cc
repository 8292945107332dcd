#include "common/control_mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradd {

absl::StatusOr<ControlMapping> ControlMapping::Map(
    const ControlLayout& layout, int job_fd, bool job_writable,
    const std::vector<int>& rank_fds) {
  if (!rank_fds.empty() && rank_fds.size() != layout.local_world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("control mapping: ", rank_fds.size(), " rank blocks for ",
                     layout.local_world_size(), " ranks"));
  }
  // Reserve the whole range first, then place each block into it with
  // MAP_FIXED: the blocks are separate memfds with separate protections.
  void* base = mmap(nullptr, layout.total_bytes(), PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "reserving ", layout.total_bytes(),
        " bytes for the control block failed: ", std::strerror(errno)));
  }
  ControlMapping out(base, layout.total_bytes());
  auto place = [&](size_t offset, size_t bytes, int fd, int prot,
                   const char* what) -> absl::Status {
    void* want = static_cast<char*>(base) + offset;
    void* p = mmap(want, bytes, prot, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      return absl::Status(
          err == EPERM || err == EACCES ? absl::StatusCode::kPermissionDenied
                                        : absl::StatusCode::kInternal,
          absl::StrCat("mapping the ", what, " (fd ", fd, ", ", bytes,
                       " bytes) failed: ", std::strerror(err)));
    }
    return absl::OkStatus();
  };
  absl::Status s =
      place(0, layout.job_bytes(), job_fd,
            job_writable ? PROT_READ | PROT_WRITE : PROT_READ, "job block");
  if (!s.ok()) return s;
  for (uint32_t r = 0; r < rank_fds.size(); ++r) {
    if (rank_fds[r] < 0) continue;
    s = place(layout.rank_block_offset(r), layout.rank_block_bytes(),
              rank_fds[r], PROT_READ | PROT_WRITE, "rank block");
    if (!s.ok()) return s;
  }
  return out;
}

absl::StatusOr<ControlMapping> ControlMapping::MapRank(
    const ControlLayout& layout, int job_fd, uint32_t rank, int rank_fd) {
  if (rank >= layout.local_world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("control mapping: local rank ", rank, " of ",
                     layout.local_world_size()));
  }
  std::vector<int> fds(layout.local_world_size(), -1);
  fds[rank] = rank_fd;
  return Map(layout, job_fd, /*job_writable=*/false, fds);
}

ControlMapping::ControlMapping(ControlMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

ControlMapping& ControlMapping::operator=(ControlMapping&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ControlMapping::~ControlMapping() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace gradd
