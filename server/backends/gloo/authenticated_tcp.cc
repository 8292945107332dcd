#include "server/backends/gloo/authenticated_tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gloo/common/error.h"
#include "gloo/transport/tcp/context.h"
#include "gloo/transport/tcp/loop.h"
#include "gloo/transport/tcp/pair.h"
#include "server/auth/pair_handshake.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace {

namespace tcp = ::gloo::transport::tcp;

constexpr int kListenBacklog = 64;

enum class Io { kDone, kAgain, kClosed, kError };

// Sends what is left of `out` after `*pos` without blocking; `*err` gets
// errno on kError.
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

// Reads until `in` holds `need` bytes, never more (what follows the
// handshake on the socket is Gloo's), without blocking.
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

std::string AddressText(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST];
  char port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host,
                  sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return addr.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port)
                                    : absl::StrCat(host, ":", port);
}

void SetNoDelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

class NoopHandler final : public tcp::Handler {
 public:
  void handleEvents(int) override {}
};

class AuthenticatedPair;

// The bytes one side of a connection's handshake exchanges: what it has
// read of the peer's current message, what it still has to send of its own,
// and whether the socket is registered for writable events meanwhile
// (AuthenticatedPair::Flush). One per connection waiting on the listening
// side, one for the pair's own connecting side.
struct HandshakeIo {
  explicit HandshakeIo(bool registered_for_out = false)
      : wants_out(registered_for_out) {}
  // The next message to send; the next one to read starts empty.
  void Next(std::string message) {
    in.clear();
    out = std::move(message);
    out_pos = 0;
  }

  std::string in;
  std::string out;
  size_t out_pos = 0;
  bool wants_out;  // registered for EPOLLOUT
};

// One accepted connection proving itself to a listening pair. Slots are
// reused, never freed while the pair lives: an event the loop fetched for a
// connection dropped in the same batch lands on a live object (and finds
// nothing to read).
struct PendingConnection final : tcp::Handler {
  enum class Step { kHello, kFinish, kAck };

  void handleEvents(int events) override;

  AuthenticatedPair* owner = nullptr;
  int fd = -1;
  uint64_t accepted = 0;  // order of arrival, to drop the oldest
  std::string from;
  std::optional<PairHandshakeServer> handshake;
  Step step = Step::kHello;
  HandshakeIo io;
};

// A pair's handshake state. It lives in the context, not in the pair, so
// that it exists before the pair's constructor has run: Gloo's constructor
// registers the pair with its I/O thread, which may call the pair's
// handler as soon as the pair's vtable is this class's (see the header).
struct PairAuthState {
  enum class ClientStep { kReply, kAck };

  // Listening side.
  std::array<std::unique_ptr<PendingConnection>, kMaxPendingConnections>
      pending;
  uint64_t next_accepted = 0;
  bool used_pending = false;
  uint64_t refused = 0;
  std::string last_refusal;
  // Connecting side.
  std::optional<PairHandshakeClient> client;
  ClientStep client_step = ClientStep::kReply;
  // Gloo registered the connecting socket for EPOLLIN | EPOLLOUT.
  HandshakeIo client_io{/*registered_for_out=*/true};
  // The pair's socket belongs to a peer that proved membership.
  bool authenticated = false;
};

class AuthenticatedContext final : public tcp::Context {
 public:
  AuthenticatedContext(std::shared_ptr<tcp::Device> device, int rank, int size,
                       std::shared_ptr<const PairAuthOptions> options,
                       std::shared_ptr<PairAuthCounters> counters)
      : tcp::Context(std::move(device), rank, size),
        options_(std::move(options)),
        counters_(std::move(counters)),
        states_(size) {
    for (auto& s : states_) s = std::make_unique<PairAuthState>();
  }
  // The pairs use their states (and their slots) until they are gone.
  ~AuthenticatedContext() override { pairs_.clear(); }

  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override;

  PairAuthState& state(int rank) { return *states_[rank]; }
  const PairAuthOptions& options() const { return *options_; }
  PairAuthCounters* counters() { return counters_.get(); }
  std::string NodeName(int r) const {
    if (r >= 0 && static_cast<size_t>(r) < options_->node_names.size() &&
        !options_->node_names[r].empty()) {
      return absl::StrCat("node '", options_->node_names[r], "' (node rank ", r,
                          ")");
    }
    return absl::StrCat("node rank ", r);
  }

 private:
  const std::shared_ptr<const PairAuthOptions> options_;
  const std::shared_ptr<PairAuthCounters> counters_;
  std::vector<std::unique_ptr<PairAuthState>> states_;
};

class AuthenticatedPair final : public tcp::Pair {
 public:
  AuthenticatedPair(AuthenticatedContext* context, tcp::Device* device,
                    int rank, std::chrono::milliseconds timeout);
  ~AuthenticatedPair() override;

  void handleEvents(int events) override;
  void OnPendingEvents(PendingConnection* p);

 protected:
  void changeState(state next) noexcept override;
  void waitUntilConnected(std::unique_lock<std::mutex>& lock,
                          bool useTimeout) override;

 private:
  AuthenticatedContext& auth() const {
    return *static_cast<AuthenticatedContext*>(context_);
  }
  PairAuthState& st() const { return auth().state(rank_); }
  std::string Where() const {
    return absl::StrCat("job '", auth().options().job_id, "', ",
                        auth().NodeName(context_->rank));
  }

  // Listening side (the pair's mutex held, Gloo's I/O thread).
  void AcceptConnections();
  PendingConnection* FreeSlot();
  void Progress(PendingConnection* p);
  void Refuse(PendingConnection* p, absl::string_view why);
  void Drop(PendingConnection* p);
  void DropAllPending();
  void HandOver(PendingConnection* p);
  // Connecting side.
  void ClientEvents(int events);
  void ClientFail(absl::string_view why);

  // epoll registration; false (and the descriptor left alone) on failure.
  bool Register(int fd, int events, tcp::Handler* h);
  // Sends what is left of io->out on `fd` (registered for `h`). kDone:
  // all of it is sent and the socket's writable events are off again;
  // kAgain: the rest waits for EPOLLOUT (registered); otherwise the
  // error (*err).
  Io Flush(HandshakeIo* io, int fd, tcp::Handler* h, int* err);
  void Unregister(int fd, tcp::Handler* h);
  // Returns once Gloo's I/O thread finished the batch of events it is in.
  void WaitForLoopTick();
};

void PendingConnection::handleEvents(int) { owner->OnPendingEvents(this); }

std::unique_ptr<gloo::transport::Pair>& AuthenticatedContext::createPair(
    int rank) {
  if (rank < 0 || rank >= size) {
    throw ::gloo::IoException(
        absl::StrCat("pair rank ", rank, " outside [0, ", size, ")"));
  }
  pairs_[rank] = std::make_unique<AuthenticatedPair>(this, device_.get(), rank,
                                                     getTimeout());
  return pairs_[rank];
}

AuthenticatedPair::AuthenticatedPair(AuthenticatedContext* context,
                                     tcp::Device* device, int rank,
                                     std::chrono::milliseconds timeout)
    : tcp::Pair(context, device, rank, timeout) {
  std::lock_guard<std::mutex> lock(m_);
  if (state_ == LISTENING) {
    // Gloo's listener is blocking; ours accepts in a loop until EAGAIN.
    // Gloo listens with a backlog of 1: strangers connecting in a loop
    // would fill it and the real peer's SYN would wait for TCP's
    // retransmission (1 s, 3 s, ...). Listening again only resizes it.
    const int flags = fcntl(fd_, F_GETFL);
    if (flags == -1 || fcntl(fd_, F_SETFL, flags | O_NONBLOCK) == -1 ||
        ::listen(fd_, kListenBacklog) == -1) {
      signalException(
          absl::StrCat(Where(), ": the pair's listener: ", strerror(errno)));
    }
  } else if (state_ == CONNECTED && !st().authenticated) {
    // Gloo's own handler took a connection before this constructor ran.
    signalException(absl::StrCat(
        Where(), ": pair to ", auth().NodeName(rank_),
        ": a connection arrived before the membership check was in place; "
        "not using it"));
  }
}

AuthenticatedPair::~AuthenticatedPair() {
  std::lock_guard<std::mutex> lock(m_);
  // Closing a socket the loop still watches waits for the loop's next tick
  // (Gloo's unregisterDescriptor); after that tick no event fetched for a
  // pending connection dropped earlier can still be delivered. Otherwise
  // wait for one here: the slots go with the context.
  const bool closing_waits =
      (state_ == CONNECTED && !sync_) ||
      ((state_ == LISTENING || state_ == CONNECTING) && fd_ != -1);
  // Gloo's destructor would do the same close, but only once this object's
  // part (its handler) is gone; close while the handler is still whole.
  if (state_ != CLOSED) changeState(CLOSED);
  if (st().used_pending && !closing_waits) WaitForLoopTick();
}

bool AuthenticatedPair::Register(int fd, int events, tcp::Handler* h) {
  try {
    device_->registerDescriptor(fd, events, h);
    return true;
  } catch (const std::exception& e) {
    spdlog::warn("{}: epoll registration of a pair connection: {}", Where(),
                 e.what());
    return false;
  }
}

Io AuthenticatedPair::Flush(HandshakeIo* io, int fd, tcp::Handler* h,
                            int* err) {
  if (io->out_pos < io->out.size()) {
    const Io sent = SendSome(fd, io->out, &io->out_pos, err);
    if (sent == Io::kAgain) {
      if (!io->wants_out && Register(fd, EPOLLIN | EPOLLOUT, h)) {
        io->wants_out = true;
      }
      return Io::kAgain;
    }
    if (sent != Io::kDone) return sent;
  }
  // Everything sent: stop the (level-triggered) writable events.
  if (io->wants_out && Register(fd, EPOLLIN, h)) io->wants_out = false;
  return Io::kDone;
}

void AuthenticatedPair::Unregister(int fd, tcp::Handler* h) {
  try {
    device_->unregisterDescriptor(fd, h);
  } catch (const std::exception&) {
    // Not registered (a failed Register): nothing to undo.
  }
}

void AuthenticatedPair::WaitForLoopTick() {
  static NoopHandler noop;
  const int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) return;
  // Unregistering from another thread waits for the loop's next tick.
  if (Register(efd, EPOLLIN, &noop)) Unregister(efd, &noop);
  ::close(efd);
}

void AuthenticatedPair::handleEvents(int events) {
  // As Gloo's handler: skip this tick if a user thread holds the pair.
  std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
  if (!lock) return;
  switch (state_) {
    case CONNECTED:
      if (st().authenticated) {
        handleReadWrite(events);
      } else {
        signalException(absl::StrCat(
            Where(), ": pair to ", auth().NodeName(rank_),
            ": a connection that never proved membership reached the pair; "
            "not using it"));
      }
      return;
    case LISTENING:
      AcceptConnections();
      return;
    case CONNECTING:
      ClientEvents(events);
      return;
    default:
      return;  // A late event for a pair already closed.
  }
}

void AuthenticatedPair::changeState(state next) noexcept {
  if (state_ == LISTENING && next != LISTENING) DropAllPending();
  tcp::Pair::changeState(next);
}

void AuthenticatedPair::waitUntilConnected(std::unique_lock<std::mutex>& lock,
                                           bool useTimeout) {
  try {
    tcp::Pair::waitUntilConnected(lock, useTimeout);
  } catch (const ::gloo::IoException& e) {
    const PairAuthState& s = st();
    if (s.refused == 0) throw;
    throw ::gloo::IoException(absl::StrCat(
        e.what(), " [the port of the pair to ", auth().NodeName(rank_),
        " refused ", s.refused,
        " connection(s) that did not prove membership of the job; the last ",
        s.last_refusal, "]"));
  }
}

PendingConnection* AuthenticatedPair::FreeSlot() {
  PairAuthState& s = st();
  s.used_pending = true;
  // Full: drop the oldest connection that has not even sent its hello (the
  // real peer sends it at once), else the oldest.
  PendingConnection* oldest = nullptr;
  for (auto& slot : s.pending) {
    if (slot == nullptr) slot = std::make_unique<PendingConnection>();
    if (slot->fd < 0) return slot.get();
    const bool silent = slot->step == PendingConnection::Step::kHello;
    const bool oldest_silent =
        oldest != nullptr && oldest->step == PendingConnection::Step::kHello;
    if (oldest == nullptr || (silent && !oldest_silent) ||
        (silent == oldest_silent && slot->accepted < oldest->accepted)) {
      oldest = slot.get();
    }
  }
  Refuse(oldest, absl::StrCat("dropped: ", kMaxPendingConnections,
                              " newer connections were waiting"));
  return oldest;
}

void AuthenticatedPair::AcceptConnections() {
  PairAuthState& s = st();
  // Bounded per event so one busy listener cannot starve the other pairs;
  // the listener stays readable and the loop comes back.
  for (int i = 0; i < kMaxPendingConnections; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: fail the pair rather than spin on a
      // listener that stays readable.
      signalException(absl::StrCat(Where(), ": accepting on the pair to ",
                                   auth().NodeName(rank_), ": ",
                                   strerror(errno)));
      return;
    }
    PendingConnection* p = FreeSlot();
    p->owner = this;
    p->fd = fd;
    p->accepted = s.next_accepted++;
    p->from = AddressText(addr, len);
    p->step = PendingConnection::Step::kHello;
    p->io = HandshakeIo();
    p->handshake.reset();
    absl::StatusOr<PairHandshakeServer> handshake = PairHandshakeServer::Create(
        auth().options().key, context_->rank, rank_);
    if (!handshake.ok()) {
      Refuse(p, handshake.status().message());
      continue;
    }
    p->handshake.emplace(*std::move(handshake));
    SetNoDelay(fd);
    if (!Register(fd, EPOLLIN, p)) {
      ::close(fd);
      p->fd = -1;
      continue;
    }
    // The hello may already be here.
    Progress(p);
    if (state_ != LISTENING) return;  // Handed over (or failed).
  }
}

void AuthenticatedPair::OnPendingEvents(PendingConnection* p) {
  std::unique_lock<std::mutex> lock(m_, std::try_to_lock);
  if (!lock) return;
  if (p->fd < 0 || state_ != LISTENING) return;
  Progress(p);
}

void AuthenticatedPair::Progress(PendingConnection* p) {
  using Step = PendingConnection::Step;
  for (;;) {
    int err = 0;
    if (const Io sent = Flush(&p->io, p->fd, p, &err); sent != Io::kDone) {
      if (sent != Io::kAgain) {
        Refuse(p,
               absl::StrCat("sending the handshake failed: ", strerror(err)));
      }
      return;
    }
    if (p->step == Step::kAck) {
      HandOver(p);
      return;
    }
    const size_t need =
        p->step == Step::kHello ? kPairHelloBytes : kPairFinishBytes;
    const Io io = RecvUpTo(p->fd, &p->io.in, need, &err);
    if (p->step == Step::kHello && !CouldBePairHello(p->io.in)) {
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
    absl::StatusOr<std::string> next = p->step == Step::kHello
                                           ? p->handshake->OnHello(p->io.in)
                                           : p->handshake->OnFinish(p->io.in);
    if (!next.ok()) {
      Refuse(p, next.status().message());
      return;
    }
    p->io.Next(*std::move(next));
    p->step = p->step == Step::kHello ? Step::kFinish : Step::kAck;
  }
}

void AuthenticatedPair::Refuse(PendingConnection* p, absl::string_view why) {
  PairAuthState& s = st();
  ++s.refused;
  if (PairAuthCounters* c = auth().counters()) ++c->refused;
  s.last_refusal = absl::StrCat("came from ", p->from, ": ", why);
  // Rate-limited: a stranger may connect in a loop.
  if (s.refused <= 3 || s.refused % 100 == 0) {
    spdlog::warn(
        "{}",
        absl::StrCat(
            Where(), ": refused a connection from ", p->from,
            " to the Gloo port of the pair to ", auth().NodeName(rank_),
            ": it did not prove membership of the job (", why, ")",
            s.refused > 3 ? absl::StrCat("; ", s.refused, " refused so far")
                          : ""));
  }
  Drop(p);
}

void AuthenticatedPair::Drop(PendingConnection* p) {
  if (p->fd < 0) return;
  Unregister(p->fd, p);
  // Reset rather than linger: the other end learns at once, and no
  // TIME_WAIT is left behind.
  struct linger reset = {1, 0};
  (void)setsockopt(p->fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  ::close(p->fd);
  p->fd = -1;
  p->handshake.reset();
}

void AuthenticatedPair::DropAllPending() {
  for (auto& slot : st().pending) {
    if (slot != nullptr) Drop(slot.get());
  }
}

void AuthenticatedPair::HandOver(PendingConnection* p) {
  PairAuthState& s = st();
  Unregister(p->fd, p);
  const int connection = p->fd;
  p->fd = -1;
  p->handshake.reset();
  // The listener has done its job; Gloo's handler would close it too.
  Unregister(fd_, this);
  ::close(fd_);
  fd_ = connection;
  s.authenticated = true;
  if (PairAuthCounters* c = auth().counters()) ++c->authenticated;
  // Gloo's own "connected" step: socket options, registration, CONNECTED
  // (which drops the other pending connections, see changeState).
  handleConnected();
}

void AuthenticatedPair::ClientEvents(int events) {
  PairAuthState& s = st();
  int err = 0;
  if (!s.client.has_value()) {
    socklen_t len = sizeof(err);
    if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) == -1) err = errno;
    if (err != 0) {
      // What Gloo's handler reports (getsockopt cleared the error, so it
      // cannot be left to Gloo).
      signalException(
          absl::StrCat("connect ", peer_.str(), ": ", strerror(err)));
      return;
    }
    if ((events & EPOLLOUT) == 0) {
      // Hung up without an error: nothing will complete the connection.
      if ((events & (EPOLLHUP | EPOLLERR)) != 0) {
        ClientFail("the connection was closed as it opened");
      }
      return;  // Otherwise not connected yet.
    }
    absl::StatusOr<PairHandshakeClient> client = PairHandshakeClient::Create(
        auth().options().key, context_->rank, rank_);
    if (!client.ok()) {
      ClientFail(client.status().message());
      return;
    }
    s.client.emplace(*std::move(client));
    s.client_step = PairAuthState::ClientStep::kReply;
    s.client_io.Next(s.client->hello());
    SetNoDelay(fd_);
  }
  for (;;) {
    if (const Io sent = Flush(&s.client_io, fd_, this, &err);
        sent != Io::kDone) {
      if (sent != Io::kAgain) {
        ClientFail(
            absl::StrCat("sending the handshake failed: ", strerror(err)));
      }
      return;
    }
    const bool reply = s.client_step == PairAuthState::ClientStep::kReply;
    const Io io = RecvUpTo(fd_, &s.client_io.in,
                           reply ? kPairReplyBytes : kPairAckBytes, &err);
    if (io == Io::kAgain) return;
    if (io == Io::kClosed) {
      ClientFail(reply ? "it closed the connection without proving membership"
                       : "it closed the connection instead of accepting this "
                         "node's proof (do both nodes hold the same pair "
                         "key?)");
      return;
    }
    if (io == Io::kError) {
      ClientFail(absl::StrCat("reading the handshake failed: ", strerror(err)));
      return;
    }
    if (reply) {
      absl::StatusOr<std::string> finish = s.client->OnReply(s.client_io.in);
      if (!finish.ok()) {
        ClientFail(finish.status().message());
        return;
      }
      s.client_io.Next(*std::move(finish));
      s.client_step = PairAuthState::ClientStep::kAck;
      continue;
    }
    if (absl::Status ack = s.client->OnAck(s.client_io.in); !ack.ok()) {
      ClientFail(ack.message());
      return;
    }
    s.client.reset();
    s.authenticated = true;
    if (PairAuthCounters* c = auth().counters()) ++c->authenticated;
    handleConnected();
    return;
  }
}

void AuthenticatedPair::ClientFail(absl::string_view why) {
  const std::string message =
      absl::StrCat(Where(), ": pair to ", auth().NodeName(rank_), " at ",
                   peer_.str(), " did not prove membership of the job: ", why);
  spdlog::warn("{}", message);
  signalException(absl::StrCat(message));
}

class AuthenticatedDevice final : public tcp::Device {
 public:
  AuthenticatedDevice(const tcp::attr& attr,
                      std::shared_ptr<const PairAuthOptions> options,
                      std::shared_ptr<PairAuthCounters> counters)
      : tcp::Device(attr),
        options_(std::move(options)),
        counters_(std::move(counters)) {}

  std::shared_ptr<gloo::transport::Context> createContext(int rank,
                                                          int size) override {
    return std::make_shared<AuthenticatedContext>(shared_from_this(), rank,
                                                  size, options_, counters_);
  }

 private:
  const std::shared_ptr<const PairAuthOptions> options_;
  const std::shared_ptr<PairAuthCounters> counters_;
};

}  // namespace

std::shared_ptr<gloo::transport::Device> CreateAuthenticatedTcpDevice(
    const gloo::transport::tcp::attr& attr, PairAuthOptions options,
    std::shared_ptr<PairAuthCounters> counters) {
  return std::make_shared<AuthenticatedDevice>(
      tcp::CreateDeviceAttr(attr),
      std::make_shared<const PairAuthOptions>(std::move(options)),
      std::move(counters));
}

}  // namespace gradd
