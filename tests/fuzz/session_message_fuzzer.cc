// The session-socket messages (common/session.h): what a trainer decodes
// from whatever answers on the daemon's session socket (DecodeSessionMessage:
// the hello, the fd message, a refusal). Properties: no crash or sanitizer
// report for any bytes; a decoding error is INTERNAL; a refusal carries an
// error status (never OK, always a canonical code) whose text needs no
// escaping (the trainer prints it); a hello speaks kSessionVersion; what
// the daemon sends (a refusal with any reason, a hello, an fd header)
// decodes to what it encoded.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "common/client_strings.h"
#include "common/session.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

std::string_view Bytes(const void* p, size_t n) {
  return std::string_view(static_cast<const char*>(p), n);
}

void CheckDecoded(const absl::StatusOr<gradd::SessionMessage>& m) {
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == absl::StatusCode::kInternal,
               m.status().ToString());
    return;
  }
  if (m->kind == gradd::SessionMessageKind::kRefused) {
    const int code = static_cast<int>(m->refusal.code());
    FUZZ_CHECK(code >= 1 && code <= 16, m->refusal.ToString());
    FUZZ_CHECK(!gradd::NeedsEscapeForLog(m->refusal.message()),
               gradd::EscapeForLog(m->refusal.message()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The bytes as one received message.
  CheckDecoded(gradd::DecodeSessionMessage(Bytes(data, size)));

  // The bytes as what a daemon puts in its messages.
  gradd::fuzz::Input in(data, size);
  gradd::SessionRefused refused;
  refused.code = in.Take<int32_t>();
  const std::string reason = in.TakeString(gradd::kSessionReasonBytes - 1);
  std::memcpy(refused.reason, reason.data(), reason.size());
  absl::StatusOr<gradd::SessionMessage> r =
      gradd::DecodeSessionMessage(Bytes(&refused, sizeof(refused)));
  CheckDecoded(r);
  FUZZ_CHECK(r.ok() && r->kind == gradd::SessionMessageKind::kRefused,
             "a refusal that does not decode");
  const std::string shown =
      gradd::EscapeForLog(reason.substr(0, std::strlen(refused.reason)));
  FUZZ_CHECK(r->refusal.message() == shown,
             std::string(r->refusal.message()) + " != " + shown);

  gradd::SessionHello hello;
  hello.session_id = in.Take<uint64_t>();
  absl::StatusOr<gradd::SessionMessage> h =
      gradd::DecodeSessionMessage(Bytes(&hello, sizeof(hello)));
  FUZZ_CHECK(h.ok() && h->kind == gradd::SessionMessageKind::kHello &&
                 h->session_id == hello.session_id,
             "a hello that does not decode");

  gradd::SessionFds fds;
  fds.attach_id = in.Take<uint64_t>();
  absl::StatusOr<gradd::SessionMessage> f =
      gradd::DecodeSessionMessage(Bytes(&fds, sizeof(fds)));
  FUZZ_CHECK(f.ok() && f->kind == gradd::SessionMessageKind::kFds &&
                 f->attach_id == fds.attach_id,
             "an fd header that does not decode");
  return 0;
}
