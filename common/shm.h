// Move-only owners for file descriptors and shared mappings, sealed memfds,
// and file-descriptor passing over Unix sockets (SCM_RIGHTS).
// Thread-compatible: each object belongs to one thread at a time.
#ifndef GRADD_COMMON_SHM_H_
#define GRADD_COMMON_SHM_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradd {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept;
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A MAP_SHARED read-write mapping; unmapped on destruction.
class Mapping {
 public:
  Mapping() = default;
  // Maps `size` bytes of `fd` from offset 0.
  static absl::StatusOr<Mapping> Map(int fd, size_t size);
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Mapping(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Creates an anonymous memfd of `size` zero bytes, sealed against shrinking,
// growing and further sealing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL).
absl::StatusOr<UniqueFd> CreateSealedMemfd(std::string_view name, size_t size);
// The same, but left open for one more seal: SealReadOnlyForOthers, once the
// creator has mapped it read-write.
absl::StatusOr<UniqueFd> CreateMemfdForSealing(std::string_view name,
                                               size_t size);
// Adds F_SEAL_FUTURE_WRITE | F_SEAL_SEAL: the mappings that exist keep
// their write access, nobody can map it writable again or write() to it
// (Linux >= 5.1; FAILED_PRECONDITION on an older kernel).
absl::Status SealReadOnlyForOthers(int fd);
// Checks that a received fd is a memfd of at least `size` bytes carrying
// F_SEAL_SHRINK (so the mapping cannot be truncated under us).
absl::Status CheckSealedMemfd(int fd, size_t size);

// Sends `payload` and `fds` as one message on a connected Unix socket
// (SOCK_SEQPACKET or SOCK_STREAM).
absl::Status SendWithFds(int socket_fd, std::string_view payload,
                         const std::vector<int>& fds);
struct ReceivedMessage {
  std::string payload;
  std::vector<UniqueFd> fds;
};
// Receives one message (up to max_payload bytes and max_fds fds), waiting
// at most `timeout`. DEADLINE_EXCEEDED on timeout, UNAVAILABLE when the peer
// closed the socket.
absl::StatusOr<ReceivedMessage> ReceiveWithFds(
    int socket_fd, size_t max_payload, size_t max_fds,
    std::chrono::milliseconds timeout);

}  // namespace gradd

#endif  // GRADD_COMMON_SHM_H_
