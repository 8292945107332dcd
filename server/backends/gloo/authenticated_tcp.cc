#include "server/backends/gloo/authenticated_tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gloo/common/error.h"
#include "gloo/transport/buffer.h"
#include "gloo/transport/context.h"
#include "gloo/transport/pair.h"
#include "gloo/transport/unbound_buffer.h"
#include "server/auth/pair_handshake.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

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

void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(v >> (24 - 8 * i));
}
uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

std::string AddressText(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6.sin6_port));
  }
  const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
  inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
  return absl::StrCat(host, ":", ntohs(in.sin_port));
}

socklen_t SockaddrLen(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6)
                                    : sizeof(sockaddr_in);
}

void SetNoDelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

bool SetBlocking(int fd, bool blocking) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags == -1) return false;
  const int want = blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK);
  return fcntl(fd, F_SETFL, want) != -1;
}

// Closes with a reset: the other end learns at once, and no TIME_WAIT is
// left behind.
void CloseWithReset(int fd) {
  struct linger reset = {1, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(fd);
}

enum class Io { kDone, kAgain, kClosed, kError };

// Non-blocking: sends what is left of `out` after `*pos`.
Io SendSome(int fd, const std::string& out, size_t* pos, int* err) {
  while (*pos < out.size()) {
    const ssize_t n = ::send(fd, out.data() + *pos, out.size() - *pos,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kAgain;
      *err = errno;
      return Io::kError;
    }
    *pos += static_cast<size_t>(n);
  }
  return Io::kDone;
}

// Non-blocking: reads until `in` holds `need` bytes, never more (what
// follows the handshake is the data path's).
Io RecvUpTo(int fd, std::string* in, size_t need, int* err) {
  while (in->size() < need) {
    char buf[128];
    const size_t want = std::min(sizeof(buf), need - in->size());
    const ssize_t n = ::recv(fd, buf, want, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kAgain;
      *err = errno;
      return Io::kError;
    }
    if (n == 0) return Io::kClosed;
    in->append(buf, static_cast<size_t>(n));
  }
  return Io::kDone;
}

// Waits for `events` on `fd` until `deadline`; false on timeout.
bool PollUntil(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(
        &p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // Let the I/O call report.
  }
}

// Blocking (by poll) up to `deadline`: a handshake step on the connecting
// side. Returns "" or why it failed.
std::string WriteAllBy(int fd, const std::string& out,
                       Clock::time_point deadline) {
  size_t pos = 0;
  for (;;) {
    int err = 0;
    const Io io = SendSome(fd, out, &pos, &err);
    if (io == Io::kDone) return "";
    if (io == Io::kError) {
      return absl::StrCat("sending the handshake failed: ", strerror(err));
    }
    if (!PollUntil(fd, POLLOUT, deadline)) {
      return "it did not take the handshake in time";
    }
  }
}

// Reads exactly `n` bytes by `deadline`; `*closed` when the peer closed.
std::string ReadExactlyBy(int fd, size_t n, Clock::time_point deadline,
                          std::string* in, bool* closed) {
  for (;;) {
    int err = 0;
    const Io io = RecvUpTo(fd, in, n, &err);
    if (io == Io::kDone) return "";
    if (io == Io::kClosed) {
      *closed = true;
      return "closed";
    }
    if (io == Io::kError) {
      return absl::StrCat("reading the handshake failed: ", strerror(err));
    }
    if (!PollUntil(fd, POLLIN, deadline)) {
      return "it did not answer the handshake in time";
    }
  }
}

// Blocking socket I/O of the data path; false with `*err` (0: closed).
bool ReadFull(int fd, char* p, size_t n, int* err) {
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_WAITALL);
    if (got < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (got == 0) {
      *err = 0;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

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

// ---------------------------------------------------------------- buffer

TcpBuffer::~TcpBuffer() {
  if (std::shared_ptr<TcpContext> context = context_.lock()) {
    for (TcpPair* pair : context->AllPairs()) {
      if (pair != nullptr) pair->Forget(this);
    }
  }
}

char* TcpBuffer::Range(size_t offset, size_t* nbytes) const {
  if (*nbytes == kUnspecifiedByteCount) {
    *nbytes = offset <= size ? size - offset : 0;
  }
  // Gloo's algorithms post empty operations past the end of small buffers.
  if (*nbytes == 0) return static_cast<char*>(ptr);
  if (offset > size || *nbytes > size - offset) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("operation on bytes [", offset, ", ",
                                           offset + *nbytes,
                                           ") of a buffer of ", size);
  }
  return static_cast<char*>(ptr) + offset;
}

void TcpBuffer::send(int dst_rank, uint64_t slot, size_t offset,
                     size_t nbytes) {
  char* data = Range(offset, &nbytes);
  std::shared_ptr<TcpContext> context = context_.lock();
  if (context == nullptr) GLOO_THROW_IO_EXCEPTION("the context is gone");
  context->PairTo(dst_rank)->PostSend(this, slot, data, nbytes);
}

void TcpBuffer::recv(int src_rank, uint64_t slot, size_t offset,
                     size_t nbytes) {
  char* data = Range(offset, &nbytes);
  std::shared_ptr<TcpContext> context = context_.lock();
  if (context == nullptr) GLOO_THROW_IO_EXCEPTION("the context is gone");
  context->PairTo(src_rank)->PostRecv(this, slot, data, nbytes);
}

void TcpBuffer::recv(std::vector<int> src_ranks, uint64_t slot, size_t offset,
                     size_t nbytes) {
  if (src_ranks.size() == 1) {
    recv(src_ranks[0], slot, offset, nbytes);
    return;
  }
  GLOO_THROW_INVALID_OPERATION_EXCEPTION(
      "gradd's Gloo transport does not receive from any of several ranks (",
      src_ranks.size(), " given)");
}

bool TcpBuffer::Wait(bool recv, int* rank, milliseconds timeout) {
  std::shared_ptr<TcpContext> context = context_.lock();
  if (timeout == gloo::transport::kUnsetTimeout) {
    timeout = context != nullptr ? context->getTimeout() : kDefaultTimeout;
  }
  std::unique_lock<std::mutex> lock(mu_);
  std::deque<int>& done = recv ? recv_ranks_ : send_ranks_;
  bool& abort = recv ? abort_recv_ : abort_send_;
  if (done.empty()) {
    const bool woke = cv_.wait_for(lock, timeout, [&] {
      return !error_.empty() || abort || !done.empty();
    });
    if (!error_.empty() && done.empty() && !abort) {
      throw gloo::IoException(error_);
    }
    if (!woke) {
      const std::string message =
          absl::StrCat("Timed out waiting ", timeout.count(), "ms for ",
                       recv ? "recv" : "send", " operation to complete");
      lock.unlock();
      // As Gloo: the operation is abandoned with its buffers, so nothing
      // of the context may still write into them.
      if (context != nullptr) context->FailAll(message);
      throw gloo::IoException(message);
    }
  }
  if (abort) {
    abort = false;
    return false;
  }
  if (rank != nullptr) *rank = done.front();
  done.pop_front();
  return true;
}

// ------------------------------------------------------------------ pair

TcpPair::TcpPair(TcpContext* context,
                 std::shared_ptr<const DeviceConfig> config, int peer,
                 milliseconds timeout)
    : context_(context),
      config_(std::move(config)),
      peer_(peer),
      timeout_(timeout) {}

TcpPair::~TcpPair() {
  Fail(absl::StrCat("Connection to peer ", PeerText(), " closed"));
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    send_cv_.notify_all();
  }
  if (reader_.joinable()) reader_.join();
  if (writer_.joinable()) writer_.join();
  if (fd_ >= 0) ::close(fd_);
}

int TcpPair::MyRank() const { return context_->rank; }

std::string TcpPair::Where() const {
  return absl::StrCat("job '", config_->options.job_id, "', ",
                      config_->NodeName(MyRank()));
}

const gloo::transport::Address& TcpPair::address() const {
  return context_->address();
}

void TcpPair::connect(const std::vector<char>& bytes) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  absl::StatusOr<PairAddress> address = PairAddress::Parse(bytes);
  if (!address.ok() || address->rank() != peer_) {
    GLOO_THROW_IO_EXCEPTION(
        Where(), ": the address published for the pair to ",
        config_->NodeName(peer_), " is not one: ",
        address.ok() ? absl::StrCat("it is rank ", address->rank(), "'s")
                     : std::string(address.status().message()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer_text_ = address->str();
  }
  // The higher rank of a pair connects; the lower one listens.
  if (peer_ < MyRank()) {
    ConnectOut(*address, deadline);
  } else {
    WaitForPeer(deadline);
  }
}

void TcpPair::ClientFail(const std::string& at, const std::string& why) {
  const std::string message =
      absl::StrCat(Where(), ": pair to ", config_->NodeName(peer_), " at ", at,
                   " did not prove membership of the job: ", why);
  spdlog::warn("{}", message);
  Fail(message);
  throw gloo::IoException(message);
}

void TcpPair::ConnectOut(const PairAddress& address,
                         Clock::time_point deadline) {
  const std::string at = address.str();
  const int fd = ::socket(address.sockaddr().ss_family,
                          SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) GLOO_THROW_IO_EXCEPTION("socket: ", strerror(errno));
  auto fail_connect = [&](int err) {
    ::close(fd);
    const std::string message =
        absl::StrCat(Where(), ": pair to ", config_->NodeName(peer_),
                     ": connect ", at, ": ", strerror(err));
    Fail(message);
    throw gloo::IoException(message);
  };
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address.sockaddr()),
                address.sockaddr_len()) != 0) {
    if (errno != EINPROGRESS) fail_connect(errno);
    if (!PollUntil(fd, POLLOUT, deadline)) fail_connect(ETIMEDOUT);
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) fail_connect(err);
  }
  SetNoDelay(fd);
  auto fail = [&](const std::string& why) {
    CloseWithReset(fd);
    ClientFail(at, why);
  };
  absl::StatusOr<PairHandshakeClient> client =
      PairHandshakeClient::Create(config_->options.key, MyRank(), peer_);
  if (!client.ok()) fail(std::string(client.status().message()));
  std::string why = WriteAllBy(fd, client->hello(), deadline);
  if (!why.empty()) fail(why);
  std::string in;
  bool closed = false;
  why = ReadExactlyBy(fd, kPairReplyBytes, deadline, &in, &closed);
  if (closed) why = "it closed the connection without proving membership";
  if (!why.empty()) fail(why);
  absl::StatusOr<std::string> finish = client->OnReply(in);
  if (!finish.ok()) fail(std::string(finish.status().message()));
  why = WriteAllBy(fd, *finish, deadline);
  if (!why.empty()) fail(why);
  in.clear();
  why = ReadExactlyBy(fd, kPairAckBytes, deadline, &in, &closed);
  if (closed) {
    why =
        "it closed the connection instead of accepting this node's proof (do "
        "both nodes hold the same pair key?)";
  }
  if (!why.empty()) fail(why);
  if (absl::Status ack = client->OnAck(in); !ack.ok()) {
    fail(std::string(ack.message()));
  }
  if (PairAuthCounters* c = config_->counters.get()) ++c->authenticated;
  if (!Establish(fd, at)) {
    std::lock_guard<std::mutex> lock(mu_);
    throw gloo::IoException(error_);
  }
}

void TcpPair::WaitForPeer(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return state_ != State::kWaiting; });
  if (state_ == State::kConnected) return;
  if (state_ == State::kFailed) throw gloo::IoException(error_);
  lock.unlock();
  const std::string message = absl::StrCat(
      Where(), ": pair to ", config_->NodeName(peer_), " at ", PeerText(),
      ": Connect timeout: the peer did not connect and prove membership "
      "within ",
      timeout_.count(), "ms", context_->RefusalNote());
  Fail(message);
  throw gloo::IoException(message);
}

bool TcpPair::Establish(int fd, const std::string& from) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kWaiting) {
      CloseWithReset(fd);
      return false;
    }
    if (peer_text_.empty()) peer_text_ = from;
    fd_ = fd;
    state_ = State::kConnected;
    cv_.notify_all();
  }
  // The data path blocks in the I/O threads, never elsewhere.
  (void)SetBlocking(fd, true);
  SetNoDelay(fd);
  reader_ = std::thread([this] { ReadLoop(); });
  writer_ = std::thread([this] { WriteLoop(); });
  context_->OnPairConnected();
  return true;
}

void TcpPair::Fail(const std::string& why, bool keep_received) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::kFailed) return;
    state_ = State::kFailed;
    error_ = why;
    // Ends the I/O threads' blocking calls; the descriptor is closed when
    // they are joined.
    if (fd_ >= 0) (void)::shutdown(fd_, SHUT_RDWR);
    cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(recv_mu_);
    recv_error_ = why;
    for (auto& [slot, recvs] : posted_) {
      for (PostedRecv& r : recvs) r.buf->SetError(why);
    }
    posted_.clear();
    if (!keep_received) early_.clear();
    spare_.clear();
    recv_cv_.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    send_error_ = why;
    for (SendOp& op : queue_) op.buf->SetError(why);
    queue_.clear();
    send_cv_.notify_all();
  }
}

void TcpPair::FailWithNotice(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    bool connected = false;
    {
      std::lock_guard<std::mutex> state(mu_);
      connected = state_ == State::kConnected;
    }
    // Only between frames: a frame in progress keeps the stream.
    if (connected && send_error_.empty() && queue_.empty() &&
        send_busy_ == nullptr) {
      const std::string text = why.substr(0, kMaxNoticeBytes);
      SendOp op;
      op.header[0] = kNoticeSlot;
      op.header[1] = text.size();
      op.data = text.data();
      int err = 0;
      (void)WriteOp(&op, /*blocking=*/false, &err);
    }
  }
  Fail(why);
}

void TcpPair::send(gloo::transport::UnboundBuffer* buf, uint64_t slot,
                   size_t offset, size_t nbytes) {
  buf->send(peer_, slot, offset, nbytes);
}

void TcpPair::recv(gloo::transport::UnboundBuffer* buf, uint64_t slot,
                   size_t offset, size_t nbytes) {
  buf->recv(peer_, slot, offset, nbytes);
}

void TcpPair::PostSend(TcpBuffer* buf, uint64_t slot, const char* data,
                       size_t nbytes) {
  SendOp op;
  op.buf = buf;
  op.header[0] = slot;
  op.header[1] = nbytes;
  op.data = data;
  std::unique_lock<std::mutex> lock(send_mu_);
  if (!send_error_.empty()) throw gloo::IoException(send_error_);
  {
    std::lock_guard<std::mutex> state(mu_);
    if (state_ == State::kFailed) throw gloo::IoException(error_);
    if (state_ != State::kConnected) {
      GLOO_THROW_IO_EXCEPTION("send to ", peer_text_, " before it connected");
    }
  }
  if (queue_.empty() && send_busy_ == nullptr) {
    // What the socket takes now goes from this thread: no hand-off.
    int err = 0;
    if (!WriteOp(&op, /*blocking=*/false, &err)) {
      lock.unlock();
      const std::string message =
          absl::StrCat("Write error ", PeerText(), ": ", strerror(err));
      buf->SetError(message);
      Fail(message);
      return;
    }
    if (op.sent == op.total()) {
      lock.unlock();
      buf->Done(/*recv=*/false, peer_);
      return;
    }
  }
  queue_.push_back(op);
  send_cv_.notify_all();
}

bool TcpPair::WriteOp(SendOp* op, bool blocking, int* err) {
  while (op->sent < op->total()) {
    iovec iov[2];
    int n = 0;
    const size_t head = sizeof(op->header);
    if (op->sent < head) {
      iov[n++] = {reinterpret_cast<char*>(op->header) + op->sent,
                  head - op->sent};
      iov[n++] = {const_cast<char*>(op->data), op->header[1]};
    } else {
      iov[n++] = {const_cast<char*>(op->data) + (op->sent - head),
                  op->total() - op->sent};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = n;
    const ssize_t wrote =
        ::sendmsg(fd_, &msg, MSG_NOSIGNAL | (blocking ? 0 : MSG_DONTWAIT));
    if (wrote < 0) {
      if (errno == EINTR) continue;
      if (!blocking && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      *err = errno;
      return false;
    }
    op->sent += static_cast<size_t>(wrote);
  }
  return true;
}

void TcpPair::WriteLoop() {
  for (;;) {
    SendOp op;
    {
      std::unique_lock<std::mutex> lock(send_mu_);
      send_cv_.wait(lock,
                    [&] { return !queue_.empty() || !send_error_.empty(); });
      if (!send_error_.empty()) return;
      op = queue_.front();
      queue_.pop_front();
      send_busy_ = op.buf;
    }
    int err = 0;
    const bool ok = WriteOp(&op, /*blocking=*/true, &err);
    if (ok) {
      op.buf->Done(/*recv=*/false, peer_);
    } else {
      const std::string message =
          absl::StrCat("Write error ", PeerText(), ": ", strerror(err));
      op.buf->SetError(message);
      Fail(message);
    }
    std::lock_guard<std::mutex> lock(send_mu_);
    send_busy_ = nullptr;
    send_cv_.notify_all();
    if (!ok) return;
  }
}

void TcpPair::PostRecv(TcpBuffer* buf, uint64_t slot, char* data,
                       size_t nbytes) {
  std::unique_lock<std::mutex> lock(recv_mu_);
  auto early = early_.find(slot);
  if (early == early_.end()) {
    if (!recv_error_.empty()) throw gloo::IoException(recv_error_);
    posted_[slot].push_back({buf, data, nbytes});
    return;
  }
  EarlyMessage message = std::move(early->second.front());
  early->second.pop_front();
  if (early->second.empty()) early_.erase(early);
  lock.unlock();
  if (message.nbytes != nbytes) {
    const std::string why =
        absl::StrCat("Message of ", message.nbytes, " bytes from ", PeerText(),
                     " for a receive of ", nbytes, " bytes on slot ", slot);
    Fail(why);
    throw gloo::IoException(why);
  }
  std::memcpy(data, message.data.get(), nbytes);
  buf->Done(/*recv=*/true, peer_);
  std::lock_guard<std::mutex> relock(recv_mu_);
  if (spare_.size() < kSpareBuffers && recv_error_.empty()) {
    spare_.push_back(std::move(message));
  }
}

void TcpPair::ReadLoop() {
  // The connection ending between frames (the peer closed it, or reset it)
  // keeps the messages that arrived whole before.
  auto fail = [&](int err) {
    Fail(err == 0
             ? absl::StrCat("Connection closed by peer ", PeerText())
             : absl::StrCat("Read error ", PeerText(), ": ", strerror(err)),
         /*keep_received=*/true);
  };
  for (;;) {
    uint64_t header[2];
    int err = 0;
    if (!ReadFull(fd_, reinterpret_cast<char*>(header), sizeof(header), &err)) {
      fail(err);
      return;
    }
    const uint64_t slot = header[0];
    const size_t nbytes = header[1];
    if (slot == kNoticeSlot) {
      std::string text(std::min(nbytes, kMaxNoticeBytes), '\0');
      if (nbytes > kMaxNoticeBytes ||
          !ReadFull(fd_, text.data(), text.size(), &err)) {
        text = "(unreadable)";
      }
      Fail(absl::StrCat("Peer ", PeerText(), " ended the connection: ", text));
      return;
    }
    PostedRecv target;
    {
      std::lock_guard<std::mutex> lock(recv_mu_);
      if (!recv_error_.empty()) return;
      auto it = posted_.find(slot);
      if (it != posted_.end()) {
        target = it->second.front();
        it->second.pop_front();
        if (it->second.empty()) posted_.erase(it);
        recv_busy_ = target.buf;
      }
    }
    if (target.buf != nullptr) {
      // Straight into the posted receive.
      std::string error;
      if (target.nbytes != nbytes) {
        error = absl::StrCat("Message of ", nbytes, " bytes from ", PeerText(),
                             " for a receive of ", target.nbytes,
                             " bytes on slot ", slot);
      } else if (!ReadFull(fd_, target.data, nbytes, &err)) {
        error =
            err == 0
                ? absl::StrCat("Connection closed by peer ", PeerText())
                : absl::StrCat("Read error ", PeerText(), ": ", strerror(err));
      }
      if (error.empty()) {
        target.buf->Done(/*recv=*/true, peer_);
      } else {
        target.buf->SetError(error);
      }
      {
        std::lock_guard<std::mutex> lock(recv_mu_);
        recv_busy_ = nullptr;
        recv_cv_.notify_all();
      }
      if (!error.empty()) {
        Fail(error);
        return;
      }
      continue;
    }
    // Nobody asked yet: keep it until the receive is posted.
    EarlyMessage message;
    {
      std::lock_guard<std::mutex> lock(recv_mu_);
      // The smallest spare buffer that fits.
      size_t best = spare_.size();
      for (size_t i = 0; i < spare_.size(); ++i) {
        if (spare_[i].capacity >= nbytes &&
            (best == spare_.size() ||
             spare_[i].capacity < spare_[best].capacity)) {
          best = i;
        }
      }
      if (best < spare_.size()) {
        message = std::move(spare_[best]);
        spare_.erase(spare_.begin() + best);
      }
    }
    message.nbytes = nbytes;
    if (message.data == nullptr) {
      message.capacity = std::max<size_t>(nbytes, 1);
      message.data.reset(new (std::nothrow) char[message.capacity]);
    }
    if (message.data == nullptr) {
      Fail(absl::StrCat("Out of memory for a message of ", nbytes,
                        " bytes from ", PeerText()));
      return;
    }
    if (!ReadFull(fd_, message.data.get(), nbytes, &err)) {
      fail(err);
      return;
    }
    std::unique_lock<std::mutex> lock(recv_mu_);
    if (!recv_error_.empty()) return;
    auto it = posted_.find(slot);
    if (it == posted_.end()) {
      early_[slot].push_back(std::move(message));
      continue;
    }
    // Posted while the payload was arriving.
    target = it->second.front();
    it->second.pop_front();
    if (it->second.empty()) posted_.erase(it);
    if (target.nbytes != nbytes) {
      const std::string error = absl::StrCat(
          "Message of ", nbytes, " bytes from ", PeerText(),
          " for a receive of ", target.nbytes, " bytes on slot ", slot);
      target.buf->SetError(error);
      lock.unlock();
      Fail(error);
      return;
    }
    std::memcpy(target.data, message.data.get(), nbytes);
    target.buf->Done(/*recv=*/true, peer_);
    if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(message));
  }
}

void TcpPair::Forget(TcpBuffer* buf) {
  {
    std::unique_lock<std::mutex> lock(recv_mu_);
    for (auto it = posted_.begin(); it != posted_.end();) {
      auto& recvs = it->second;
      recvs.erase(
          std::remove_if(recvs.begin(), recvs.end(),
                         [&](const PostedRecv& r) { return r.buf == buf; }),
          recvs.end());
      if (recvs.empty()) {
        posted_.erase(it++);
      } else {
        ++it;
      }
    }
    recv_cv_.wait(lock, [&] { return recv_busy_ != buf; });
  }
  std::unique_lock<std::mutex> lock(send_mu_);
  // A frame partly written must go out whole (the stream would be torn);
  // the writer takes it next.
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->buf == buf && it->sent == 0) {
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  send_cv_.wait(lock, [&] {
    if (send_busy_ == buf) return false;
    for (const SendOp& op : queue_) {
      if (op.buf == buf) return false;
    }
    return true;
  });
}

// --------------------------------------------------------------- context

TcpContext::TcpContext(std::shared_ptr<const DeviceConfig> config, int rank,
                       int size)
    : gloo::transport::Context(rank, size), config_(std::move(config)) {
  pairs_.resize(size);
  pairs_mine_.resize(size, nullptr);
  pending_.reserve(kMaxPendingConnections);
  timeout_ = kDefaultTimeout;
  sockaddr_storage addr = config_->bind_addr;
  listen_fd_ =
      ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) GLOO_THROW_IO_EXCEPTION("socket: ", strerror(errno));
  socklen_t len = SockaddrLen(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, kListenBacklog) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    GLOO_THROW_IO_EXCEPTION("listening on ", config_->host, ": ",
                            strerror(err));
  }
  address_ = PairAddress(addr, rank);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    ::close(listen_fd_);
    GLOO_THROW_IO_EXCEPTION("eventfd: ", strerror(errno));
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpContext::~TcpContext() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  Wake();
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(pairs_mine_.begin(), pairs_mine_.end(), nullptr);
  }
  // The pairs use this object until they are gone.
  pairs_.clear();
  ::close(wake_fd_);
}

std::unique_ptr<gloo::transport::Pair>& TcpContext::createPair(int peer) {
  if (peer < 0 || peer >= size || peer == rank) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("no pair from rank ", rank,
                                           " to rank ", peer, " of ", size);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (pairs_[peer] != nullptr) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("the pair to rank ", peer,
                                           " exists already");
  }
  handshake_ms_ = getTimeout().count();
  auto pair = std::make_unique<TcpPair>(this, config_, peer, getTimeout());
  pairs_mine_[peer] = pair.get();
  pairs_[peer] = std::move(pair);
  return pairs_[peer];
}

TcpPair* TcpContext::PairTo(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (peer < 0 || peer >= size || pairs_mine_[peer] == nullptr) {
    GLOO_THROW_INVALID_OPERATION_EXCEPTION("rank ", rank, " has no pair to ",
                                           peer, " (", size, " ranks)");
  }
  return pairs_mine_[peer];
}

void TcpContext::FailAll(const std::string& why) {
  for (TcpPair* pair : AllPairs()) {
    if (pair != nullptr) pair->FailWithNotice(why);
  }
}

void TcpContext::OnPairConnected() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++connected_;
  }
  Wake();
}

std::string TcpContext::RefusalNote() {
  std::lock_guard<std::mutex> lock(mu_);
  if (refused_ == 0) return "";
  return absl::StrCat(" [the pair port of ", config_->NodeName(rank),
                      " refused ", refused_,
                      " connection(s) that did not prove membership of the "
                      "job; the last ",
                      last_refusal_, "]");
}

void TcpContext::AcceptLoop() {
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Every pair is in: nobody else may connect.
      if (closing_ || connected_ >= size - 1) break;
    }
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point next = Clock::now() + std::chrono::hours(1);
    for (const Pending& p : pending_) {
      const bool out = p.out_pos < p.out.size();
      fds.push_back(
          {p.fd, static_cast<short>(POLLIN | (out ? POLLOUT : 0)), 0});
      next = std::min(next, p.deadline);
    }
    const auto wait =
        std::chrono::duration_cast<milliseconds>(next - Clock::now());
    const int n =
        ::poll(fds.data(), fds.size(),
               static_cast<int>(std::max<int64_t>(0, wait.count()) + 1));
    if (n < 0 && errno != EINTR) {
      spdlog::warn("{}: polling the pair port: {}", Where(), strerror(errno));
      break;
    }
    if (fds[0].revents != 0) {
      uint64_t drained;
      (void)!::read(wake_fd_, &drained, sizeof(drained));
    }
    // Pending connections first (by descriptor: slots move as they go).
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      for (Pending& p : pending_) {
        if (p.fd == fds[i].fd) {
          Progress(&p);
          break;
        }
      }
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                    [](const Pending& p) { return p.fd < 0; }),
                     pending_.end());
    }
    if (fds[1].revents != 0) AcceptSome();
    const Clock::time_point now = Clock::now();
    for (Pending& p : pending_) {
      if (p.fd >= 0 && now >= p.deadline) {
        Refuse(&p, "it did not complete the handshake in time");
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const Pending& p) { return p.fd < 0; }),
                   pending_.end());
  }
  // Every pair is connected, so whoever is still waiting, or still queued
  // in the kernel, is not a member of the job: refused, logged and counted
  // like any stranger (gloo_backend.h), not dropped unseen when the port
  // closes.
  constexpr absl::string_view kLate =
      "every pair of the job was connected already";
  for (Pending& p : pending_) Refuse(&p, kLate);
  pending_.clear();
  for (int i = 0; i < kMaxQueuedAtClose; ++i) {
    Pending queued;
    if (!AcceptOne(&queued)) break;
    Refuse(&queued, kLate);
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
}

Pending* TcpContext::FreeSlot() {
  if (pending_.size() < static_cast<size_t>(kMaxPendingConnections)) {
    pending_.emplace_back();
    return &pending_.back();
  }
  // Full: drop the oldest connection that has not even sent its hello (the
  // real peer sends it at once), else the oldest.
  Pending* oldest = nullptr;
  for (Pending& p : pending_) {
    const bool silent = p.step == Pending::Step::kHello;
    const bool oldest_silent =
        oldest != nullptr && oldest->step == Pending::Step::kHello;
    if (oldest == nullptr || (silent && !oldest_silent) ||
        (silent == oldest_silent && p.order < oldest->order)) {
      oldest = &p;
    }
  }
  Refuse(oldest, absl::StrCat("dropped: ", kMaxPendingConnections,
                              " newer connections were waiting"));
  *oldest = Pending();
  return oldest;
}

bool TcpContext::AcceptOne(Pending* p) {
  while (true) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr),
                             &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("{}: accepting on the pair port: {}", Where(),
                     strerror(errno));
      }
      return false;
    }
    p->fd = fd;
    p->from = AddressText(addr);
    return true;
  }
}

void TcpContext::AcceptSome() {
  // Bounded per wake-up so the pending connections keep their turn.
  for (int i = 0; i < kMaxPendingConnections; ++i) {
    Pending accepted;
    if (!AcceptOne(&accepted)) return;
    SetNoDelay(accepted.fd);
    Pending* p = FreeSlot();
    p->fd = accepted.fd;
    p->order = next_order_++;
    p->from = std::move(accepted.from);
    p->deadline = Clock::now() + milliseconds(handshake_ms_.load());
    // The hello may already be here.
    Progress(p);
  }
}

void TcpContext::Progress(Pending* p) {
  using Step = Pending::Step;
  for (;;) {
    int err = 0;
    if (p->out_pos < p->out.size()) {
      const Io sent = SendSome(p->fd, p->out, &p->out_pos, &err);
      if (sent == Io::kAgain) return;
      if (sent != Io::kDone) {
        Refuse(p,
               absl::StrCat("sending the handshake failed: ", strerror(err)));
        return;
      }
    }
    if (p->step == Step::kAck) {
      HandOver(p);
      return;
    }
    const size_t need =
        p->step == Step::kHello ? kPairHelloBytes : kPairFinishBytes;
    const Io io = RecvUpTo(p->fd, &p->in, need, &err);
    if (p->step == Step::kHello && !CouldBePairHello(p->in)) {
      Refuse(p, "the connection did not open with a gradd pair handshake");
      return;
    }
    if (io == Io::kAgain) return;
    if (io == Io::kClosed) {
      Refuse(p, "it closed the connection before proving membership");
      return;
    }
    if (io == Io::kError) {
      Refuse(p, absl::StrCat("reading the handshake failed: ", strerror(err)));
      return;
    }
    absl::StatusOr<std::string> next;
    if (p->step == Step::kHello) {
      // The hello's layout (auth/pair_handshake.h): magic (8) | client
      // rank | server rank | nonce. The client rank picks the pair; the
      // handshake checks the rest.
      const uint32_t client = GetU32(p->in.data() + 8);
      if (client <= static_cast<uint32_t>(rank) ||
          client >= static_cast<uint32_t>(size)) {
        Refuse(p,
               absl::StrCat("its hello is from rank ", client, "; ranks ",
                            rank + 1, "..", size - 1, " connect to this port"));
        return;
      }
      p->client = static_cast<int>(client);
      TcpPair* pair = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pair = pairs_mine_[p->client];
      }
      if (pair == nullptr || !pair->Waiting()) {
        Refuse(p, "the pair is not waiting for a connection");
        return;
      }
      absl::StatusOr<PairHandshakeServer> handshake =
          PairHandshakeServer::Create(config_->options.key, rank, client);
      if (!handshake.ok()) {
        Refuse(p, handshake.status().message());
        return;
      }
      p->handshake.emplace(*std::move(handshake));
      next = p->handshake->OnHello(p->in);
    } else {
      next = p->handshake->OnFinish(p->in);
    }
    if (!next.ok()) {
      Refuse(p, next.status().message());
      return;
    }
    p->in.clear();
    p->out = *std::move(next);
    p->out_pos = 0;
    p->step = p->step == Step::kHello ? Step::kFinish : Step::kAck;
  }
}

void TcpContext::Refuse(Pending* p, absl::string_view why) {
  uint64_t refused = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused = ++refused_;
    last_refusal_ = absl::StrCat("came from ", p->from, ": ", why);
  }
  if (PairAuthCounters* c = config_->counters.get()) ++c->refused;
  const std::string pair =
      p->client > rank && p->client < size
          ? absl::StrCat("the pair to ", config_->NodeName(p->client))
          : "this node's pairs";
  // Rate-limited: a stranger may connect in a loop.
  if (refused <= 3 || refused % 100 == 0) {
    spdlog::warn(
        "{}",
        absl::StrCat(
            Where(), ": refused a connection from ", p->from,
            " to the Gloo port of ", pair,
            ": it did not prove membership of the job (", why, ")",
            refused > 3 ? absl::StrCat("; ", refused, " refused so far") : ""));
  }
  Drop(p);
}

void TcpContext::Drop(Pending* p) {
  if (p->fd < 0) return;
  CloseWithReset(p->fd);
  p->fd = -1;
  p->handshake.reset();
}

void TcpContext::HandOver(Pending* p) {
  TcpPair* pair = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pair = pairs_mine_[p->client];
  }
  const int fd = p->fd;
  p->fd = -1;
  p->handshake.reset();
  if (pair == nullptr) {
    CloseWithReset(fd);
    return;
  }
  if (PairAuthCounters* c = config_->counters.get()) ++c->authenticated;
  (void)pair->Establish(fd, p->from);
}

// ---------------------------------------------------------------- device

class TcpDevice final : public gloo::transport::Device {
 public:
  explicit TcpDevice(std::shared_ptr<const DeviceConfig> config)
      : config_(std::move(config)) {}

  std::string str() const override {
    return absl::StrCat("gradd-tcp:", config_->host);
  }
  const std::string& getPCIBusID() const override { return pci_bus_id_; }
  std::shared_ptr<gloo::transport::Context> createContext(int rank,
                                                          int size) override {
    return std::make_shared<TcpContext>(config_, rank, size);
  }

 private:
  const std::shared_ptr<const DeviceConfig> config_;
  const std::string pci_bus_id_;
};

}  // namespace

// --------------------------------------------------------------- address

PairAddress::PairAddress(const sockaddr_storage& addr, int rank)
    : addr_(addr), rank_(rank) {}

socklen_t PairAddress::sockaddr_len() const { return SockaddrLen(addr_); }

std::string PairAddress::str() const { return AddressText(addr_); }

std::vector<char> PairAddress::bytes() const {
  std::vector<char> out(kBytes, 0);
  std::memcpy(out.data(), kAddressMagic.data(), 4);
  PutU32(out.data() + 4, static_cast<uint32_t>(rank_));
  uint16_t port = 0;
  if (addr_.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr_);
    port = ntohs(in6.sin6_port);
    std::memcpy(out.data() + 12, &in6.sin6_addr, 16);
  } else {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr_);
    port = ntohs(in.sin_port);
    std::memcpy(out.data() + 12, &in.sin_addr, 4);
  }
  out[8] = static_cast<char>(addr_.ss_family >> 8);
  out[9] = static_cast<char>(addr_.ss_family & 0xff);
  out[10] = static_cast<char>(port >> 8);
  out[11] = static_cast<char>(port & 0xff);
  return out;
}

absl::StatusOr<PairAddress> PairAddress::Parse(const std::vector<char>& bytes) {
  if (bytes.size() != kBytes ||
      absl::string_view(bytes.data(), 4) != kAddressMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a gradd pair address (", bytes.size(), " bytes)"));
  }
  const int family =
      (static_cast<uint8_t>(bytes[8]) << 8) | static_cast<uint8_t>(bytes[9]);
  const uint16_t port = static_cast<uint16_t>(
      (static_cast<uint8_t>(bytes[10]) << 8) | static_cast<uint8_t>(bytes[11]));
  sockaddr_storage addr{};
  if (family == AF_INET6) {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(addr);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(port);
    std::memcpy(&in6.sin6_addr, bytes.data() + 12, 16);
  } else if (family == AF_INET) {
    auto& in = reinterpret_cast<sockaddr_in&>(addr);
    in.sin_family = AF_INET;
    in.sin_port = htons(port);
    std::memcpy(&in.sin_addr, bytes.data() + 12, 4);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradd pair address of family ", family));
  }
  return PairAddress(addr, static_cast<int>(GetU32(bytes.data() + 4)));
}

absl::StatusOr<std::shared_ptr<gloo::transport::Device>>
CreateAuthenticatedTcpDevice(const std::string& host, PairAuthOptions options,
                             std::shared_ptr<PairAuthCounters> counters) {
  if (options.key.size() != kPairKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pair key has ", kPairKeyBytes, " bytes, not ", options.key.size()));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("the Gloo transport's host '", host,
                     "' does not resolve: ", gai_strerror(rc)));
  }
  auto config = std::make_shared<DeviceConfig>();
  std::memcpy(&config->bind_addr, found->ai_addr,
              std::min<size_t>(found->ai_addrlen, sizeof(sockaddr_storage)));
  freeaddrinfo(found);
  // Port 0: each context's listener gets one from the OS.
  if (config->bind_addr.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6&>(config->bind_addr).sin6_port = 0;
  } else {
    reinterpret_cast<sockaddr_in&>(config->bind_addr).sin_port = 0;
  }
  config->host = host;
  config->options = std::move(options);
  config->counters = std::move(counters);
  return std::shared_ptr<gloo::transport::Device>(
      std::make_shared<TcpDevice>(std::move(config)));
}

}  // namespace gradd
