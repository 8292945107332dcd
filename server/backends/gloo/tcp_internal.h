// The insides of gradd's Gloo transport (authenticated_tcp.h says what it
// does and why): the socket helpers, and the buffer, pair and context
// classes that authenticated_tcp.cc (context, device, addresses),
// tcp_pair.cc (buffers and pairs) and tcp_socket_io.cc (the helpers)
// define. Nothing outside those three files includes this.
#ifndef GRADD_SERVER_BACKENDS_GLOO_TCP_INTERNAL_H_
#define GRADD_SERVER_BACKENDS_GLOO_TCP_INTERNAL_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gloo/common/error.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/unbound_buffer.h"
#include "server/auth/pair_handshake.h"
#include "server/backends/gloo/authenticated_tcp.h"

namespace gradd {
namespace tcp_internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kListenBacklog = 64;
constexpr absl::string_view kAddressMagic = "gpa1";
constexpr milliseconds kDefaultTimeout{30000};
// A frame on this slot ends the connection and says why (its payload, at
// most kMaxNoticeBytes): a peer that gave up on a timeout says so, so that
// the nodes waiting on it report a timeout too, not a lost peer. (Gloo's
// slots carry an 8-bit prefix below 0xff.)
constexpr uint64_t kNoticeSlot = ~uint64_t{0};
constexpr size_t kMaxNoticeBytes = 1024;

void PutU32(char* out, uint32_t v);

uint32_t GetU32(const char* in);

std::string AddressText(const sockaddr_storage& addr);

socklen_t SockaddrLen(const sockaddr_storage& addr);

void SetNoDelay(int fd);

bool SetBlocking(int fd, bool blocking);

// Closes with a reset: the other end learns at once, and no TIME_WAIT is
// left behind.
void CloseWithReset(int fd);

enum class Io { kDone, kAgain, kClosed, kError };

// Non-blocking: sends what is left of `out` after `*pos`.
Io SendSome(int fd, const std::string& out, size_t* pos, int* err);

// Non-blocking: reads until `in` holds `need` bytes, never more (what
// follows the handshake is the data path's).
Io RecvUpTo(int fd, std::string* in, size_t need, int* err);

// Waits for `events` on `fd` until `deadline`; false on timeout.
bool PollUntil(int fd, short events, Clock::time_point deadline);

// Blocking (by poll) up to `deadline`: a handshake step on the connecting
// side. Returns "" or why it failed.
std::string WriteAllBy(int fd, const std::string& out,
                       Clock::time_point deadline);

// Reads exactly `n` bytes by `deadline`; `*closed` when the peer closed.
std::string ReadExactlyBy(int fd, size_t n, Clock::time_point deadline,
                          std::string* in, bool* closed);

// Blocking socket I/O of the data path; false with `*err` (0: closed).
bool ReadFull(int fd, char* p, size_t n, int* err);

// Everything a device's contexts share.
struct DeviceConfig {
  sockaddr_storage bind_addr{};
  std::string host;
  PairAuthOptions options;
  std::shared_ptr<PairAuthCounters> counters;

  std::string NodeName(int r) const {
    if (r >= 0 && static_cast<size_t>(r) < options.node_names.size() &&
        !options.node_names[r].empty()) {
      return absl::StrCat("node '", options.node_names[r], "' (node rank ", r,
                          ")");
    }
    return absl::StrCat("node rank ", r);
  }
};

class TcpContext;
class TcpBuffer;

// One frame of the data path, on its way out.
struct SendOp {
  TcpBuffer* buf = nullptr;
  uint64_t header[2] = {0, 0};  // slot, nbytes
  const char* data = nullptr;
  size_t sent = 0;  // Of header and payload together.
  size_t total() const { return sizeof(header) + header[1]; }
};

struct PostedRecv {
  TcpBuffer* buf = nullptr;
  char* data = nullptr;
  size_t nbytes = 0;
};

struct EarlyMessage {
  std::unique_ptr<char[]> data;
  size_t nbytes = 0;
  size_t capacity = 0;
};

// Buffers of messages that arrived before their receive, kept for the next
// ones: a fresh allocation of a segment-sized buffer costs an mmap and a
// page fault per page, which showed at 25 MiB.
constexpr size_t kSpareBuffers = 4;

class TcpBuffer final : public gloo::transport::UnboundBuffer {
 public:
  TcpBuffer(std::weak_ptr<TcpContext> context, void* ptr, size_t size)
      : gloo::transport::UnboundBuffer(ptr, size),
        context_(std::move(context)) {}
  ~TcpBuffer() override;

  bool waitRecv(int* rank, milliseconds timeout) override {
    return Wait(/*recv=*/true, rank, timeout);
  }
  bool waitSend(int* rank, milliseconds timeout) override {
    return Wait(/*recv=*/false, rank, timeout);
  }
  void abortWaitRecv() override { Abort(/*recv=*/true); }
  void abortWaitSend() override { Abort(/*recv=*/false); }
  void send(int dst_rank, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(int src_rank, uint64_t slot, size_t offset, size_t nbytes) override;
  void recv(std::vector<int> src_ranks, uint64_t slot, size_t offset,
            size_t nbytes) override;

  // From the pairs (any thread).
  void Done(bool recv, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    (recv ? recv_ranks_ : send_ranks_).push_back(rank);
    cv_.notify_all();
  }
  void SetError(const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = error;
    cv_.notify_all();
  }

 private:
  bool Wait(bool recv, int* rank, milliseconds timeout);
  void Abort(bool recv) {
    std::lock_guard<std::mutex> lock(mu_);
    (recv ? abort_recv_ : abort_send_) = true;
    cv_.notify_all();
  }
  char* Range(size_t offset, size_t* nbytes) const;

  const std::weak_ptr<TcpContext> context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> recv_ranks_;  // One per completed operation.
  std::deque<int> send_ranks_;
  bool abort_recv_ = false;
  bool abort_send_ = false;
  std::string error_;
};

// One connection between two ranks of a context. States:
//
//   kWaiting --Establish(fd)--> kConnected --Fail--> kFailed
//       \-------------------------Fail-------------------^
//
// Establish comes from connect() (connecting side) or the context's accept
// thread (listening side, possibly before connect() ran). Fail is final:
// the socket is shut down (the I/O threads end), every pending operation's
// buffer gets the error, and later operations throw it.
class TcpPair final : public gloo::transport::Pair {
 public:
  TcpPair(TcpContext* context, std::shared_ptr<const DeviceConfig> config,
          int peer, milliseconds timeout);
  ~TcpPair() override;

  const gloo::transport::Address& address() const override;
  void connect(const std::vector<char>& bytes) override;
  void close() override {
    Fail(absl::StrCat("Connection to peer ", PeerText(), " closed by ",
                      config_->NodeName(MyRank())));
  }
  void setSync(bool, bool) override {}
  std::unique_ptr<gloo::transport::Buffer> createSendBuffer(int, void*,
                                                            size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION(
        "gradd's Gloo transport supports unbound buffers only");
  }
  std::unique_ptr<gloo::transport::Buffer> createRecvBuffer(int, void*,
                                                            size_t) override {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION(
        "gradd's Gloo transport supports unbound buffers only");
  }
  void send(gloo::transport::UnboundBuffer* buf, uint64_t slot, size_t offset,
            size_t nbytes) override;
  void recv(gloo::transport::UnboundBuffer* buf, uint64_t slot, size_t offset,
            size_t nbytes) override;

  void PostSend(TcpBuffer* buf, uint64_t slot, const char* data, size_t nbytes);
  void PostRecv(TcpBuffer* buf, uint64_t slot, char* data, size_t nbytes);
  // Drops `buf`'s pending operations; returns once no I/O thread uses it.
  void Forget(TcpBuffer* buf);
  // A connection whose other end proved membership. False (and `fd`
  // closed) when the pair is no longer waiting for one.
  bool Establish(int fd, const std::string& from);
  bool Waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ == State::kWaiting;
  }
  // `keep_received`: messages that arrived whole before the failure stay
  // deliverable to receives posted later (the peer sent them and then
  // closed: a collective whose last step is a send from the peer, e.g. a
  // broadcast rooted there, ends on the peer's side before this side has
  // posted its receive). Every other receive fails with `why`.
  void Fail(const std::string& why, bool keep_received = false);
  // Fail, telling the peer why first (best effort, never blocking).
  void FailWithNotice(const std::string& why);

 private:
  enum class State { kWaiting, kConnected, kFailed };

  int MyRank() const;
  std::string PeerText() {
    std::lock_guard<std::mutex> lock(mu_);
    return peer_text_;
  }
  std::string Where() const;
  void ConnectOut(const PairAddress& address, Clock::time_point deadline);
  void WaitForPeer(Clock::time_point deadline);
  [[noreturn]] void ClientFail(const std::string& at, const std::string& why);
  void ReadLoop();
  void WriteLoop();
  // Writes what is left of `op`; `blocking` false: only what the socket
  // takes now. Returns false with errno in `*err` on an error.
  bool WriteOp(SendOp* op, bool blocking, int* err);

  TcpContext* const context_;
  const std::shared_ptr<const DeviceConfig> config_;
  const int peer_;
  const milliseconds timeout_;

  std::mutex mu_;  // State; never held while taking recv_mu_/send_mu_.
  std::condition_variable cv_;
  State state_ = State::kWaiting;
  int fd_ = -1;
  std::string error_;
  std::string peer_text_;  // The peer's published address (or where from).
  std::thread reader_;
  std::thread writer_;

  std::mutex recv_mu_;
  std::condition_variable recv_cv_;
  std::string recv_error_;
  absl::flat_hash_map<uint64_t, std::deque<PostedRecv>> posted_;
  absl::flat_hash_map<uint64_t, std::deque<EarlyMessage>> early_;
  std::vector<EarlyMessage> spare_;  // At most kSpareBuffers.
  TcpBuffer* recv_busy_ = nullptr;   // The reader is writing into it.

  std::mutex send_mu_;
  std::condition_variable send_cv_;
  std::string send_error_;
  std::deque<SendOp> queue_;
  TcpBuffer* send_busy_ = nullptr;  // The writer is reading from it.
};

// A connection on the listener proving itself (accept thread only).
struct Pending {
  enum class Step { kHello, kFinish, kAck };
  int fd = -1;
  uint64_t order = 0;
  std::string from;
  Clock::time_point deadline;
  Step step = Step::kHello;
  int client = -1;
  std::optional<PairHandshakeServer> handshake;
  std::string in;
  std::string out;
  size_t out_pos = 0;
};

class TcpContext final : public gloo::transport::Context,
                         public std::enable_shared_from_this<TcpContext> {
 public:
  TcpContext(std::shared_ptr<const DeviceConfig> config, int rank, int size);
  ~TcpContext() override;

  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override;
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(
      void* ptr, size_t size) override {
    return std::make_unique<TcpBuffer>(weak_from_this(), ptr, size);
  }

  const PairAddress& address() const { return address_; }
  // The pair to `rank`; throws for a rank without one.
  TcpPair* PairTo(int rank);
  std::vector<TcpPair*> AllPairs() {
    std::lock_guard<std::mutex> lock(mu_);
    return pairs_mine_;
  }
  // Fails every pair, telling each peer why.
  void FailAll(const std::string& why);
  void OnPairConnected();
  // " [this node's pair port refused N ...]" or "".
  std::string RefusalNote();

 private:
  void AcceptLoop();
  void AcceptSome();
  // One connection off the port into p->fd and p->from; false when none is
  // waiting (or accept failed, logged).
  bool AcceptOne(Pending* p);
  Pending* FreeSlot();
  void Progress(Pending* p);
  void Refuse(Pending* p, absl::string_view why);
  void Drop(Pending* p);
  void HandOver(Pending* p);
  void Wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
  std::string Where() const {
    return absl::StrCat("job '", config_->options.job_id, "', ",
                        config_->NodeName(rank));
  }

  const std::shared_ptr<const DeviceConfig> config_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  PairAddress address_;
  std::thread acceptor_;

  std::mutex mu_;
  std::vector<TcpPair*> pairs_mine_;  // By rank; the base class owns them.
  int connected_ = 0;
  bool closing_ = false;
  uint64_t refused_ = 0;
  std::string last_refusal_;

  // The pair timeout, for handshakes on the listener (set by createPair).
  std::atomic<int64_t> handshake_ms_{kDefaultTimeout.count()};

  // Accept thread only.
  std::vector<Pending> pending_;
  uint64_t next_order_ = 0;
};

}  // namespace tcp_internal
}  // namespace gradd

#endif  // GRADD_SERVER_BACKENDS_GLOO_TCP_INTERNAL_H_
