// Buffers and pairs of gradd's Gloo transport (tcp_internal.h).
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
#include "server/backends/gloo/tcp_internal.h"
#include "spdlog/spdlog.h"

namespace gradd {
namespace tcp_internal {

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

}  // namespace tcp_internal
}  // namespace gradd
