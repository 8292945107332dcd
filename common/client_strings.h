// Strings that come from clients: job ids, parameter names, node ids,
// coordinator addresses, hook names (every `string` of a request). Both
// sides apply the same rules: the client library before it sends anything
// (client/src/client.cc), the daemon at its edge (server/rpc/
// request_checks.h), so a bad string is refused with INVALID_ARGUMENT naming
// its field and never reaches the engine, a log line or a metric label.
//
// A client string must be valid UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), hold no control character (C0
// U+0000-U+001F, DEL U+007F, C1 U+0080-U+009F) and no line or paragraph
// separator (U+2028, U+2029), and fit its field's byte limit. Why: these
// strings end up in the daemon's log, in error messages that trainers print
// and in terminals; a newline there ends a line and forges the next one, an
// escape sequence drives the operator's terminal.
//
// EscapeForLog is the other half: whatever reaches a log line is made to fit
// on that one line (server/logging.cc applies it to every line the daemon
// writes), whether or not it was checked.
//
// Pure functions; thread-safe.
#ifndef GRADD_COMMON_CLIENT_STRINGS_H_
#define GRADD_COMMON_CLIENT_STRINGS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradd {

// Byte limits of the client string fields (the engine applies the same
// limits to job and node ids and parameter names).
inline constexpr size_t kMaxJobIdBytes = 256;
inline constexpr size_t kMaxNodeIdBytes = 256;
inline constexpr size_t kMaxParamNameBytes = 4096;
// host:port of a rendezvous coordinator.
inline constexpr size_t kMaxCoordinatorBytes = 1024;
inline constexpr size_t kMaxCommHookNameBytes = 64;

// Offset of the first byte of `text` that is not part of a well-formed UTF-8
// sequence, or absl::string_view::npos when all of it is UTF-8.
size_t FindInvalidUtf8(absl::string_view text);

// OK, or INVALID_ARGUMENT naming `field` (e.g. "AttachRequest.job_id") and
// saying what is wrong: over `max_bytes`, not UTF-8 (the offending byte and
// its offset), or a control character or line break (its code point and
// offset). The message quotes the start of the value, escaped.
absl::Status CheckClientString(absl::string_view field, absl::string_view value,
                               size_t max_bytes);

// `text` with every byte that does not belong on one line of text escaped:
// \n, \r and \t; other C0 controls and DEL as \xHH; C1 controls and
// U+2028/U+2029 as \uHHHH; bytes that are not UTF-8 as \xHH. Everything else
// (printable ASCII, other UTF-8 text) is kept. Backslashes are kept as they
// are: the point is that a line stays one line, not that the escaping can be
// undone.
std::string EscapeForLog(absl::string_view text);

// Whether EscapeForLog(text) differs from `text`.
bool NeedsEscapeForLog(absl::string_view text);

}  // namespace gradd

#endif  // GRADD_COMMON_CLIENT_STRINGS_H_
