// The daemon's log: spdlog (Debian's libspdlog-dev) behind a few helpers.
//
// Why spdlog: Debian 12's Abseil (20220623) predates absl/log, and glog
// brings its own flag library and writes to files by default. spdlog has
// run-time levels, fmt formatting and a journald sink, and is packaged.
//
// Where lines go (InitLogging):
//   - under systemd (JOURNAL_STREAM names our stderr): to the journal with
//     the level as its PRIORITY, so `journalctl -p warning -u gradd` works
//     and journald adds the timestamps;
//   - otherwise to stderr, one line each: "2026-12-01T11:30:00.123456Z I
//     gradd: message" (UTC, microseconds, level letter).
// Either way each message is escaped first (EscapeForLog,
// common/client_strings.h): a newline, another control character or bytes
// that are not UTF-8 in it (from a client string, say) are written as \n,
// \xHH, ..., so every log call is exactly one line. Protobuf's own messages
// are routed here too.
//
// Only the daemon logs through this; the client library never touches the
// host program's loggers.
#ifndef GRADD_SERVER_LOGGING_H_
#define GRADD_SERVER_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

// Build cost, not behaviour: spdlog formats through
// fmt::detail::vformat_to<char>, which Debian 12's fmt 9 header does not
// declare as instantiated in libfmt (fmt 10 does). Without this every file
// that logs with arguments compiles its own copy of fmt's whole formatting
// engine (~60 KB of code at -O3, a fifth of the daemon's object code); with
// it they all call the one in libfmt.so, built from the same fmt version.
#if !defined(FMT_HEADER_ONLY) && FMT_VERSION >= 90000 && FMT_VERSION < 100000
FMT_BEGIN_NAMESPACE
namespace detail {
extern template FMT_API void vformat_to<char>(
    buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
    locale_ref);
}  // namespace detail
FMT_END_NAMESPACE
#endif

namespace gradd {

enum class LogDestination { kAuto, kStderr, kJournal };

// Sets the daemon-wide logger. `level`: trace, debug, info, warning (warn),
// error, off. INVALID_ARGUMENT naming the accepted levels otherwise. Safe to
// call again (tests); before any call, lines go to stderr at info.
absl::Status InitLogging(absl::string_view level,
                         LogDestination destination = LogDestination::kAuto);

// OK if InitLogging accepts `level`; INVALID_ARGUMENT naming the choices.
absl::Status ValidateLogLevel(absl::string_view level);

// The level names InitLogging accepts, for --help.
constexpr absl::string_view kLogLevels =
    "trace, debug, info, warning, error, off";

// True when stderr is connected to the journal (systemd's JOURNAL_STREAM
// matches fd 2's device and inode).
bool StderrIsJournal();

}  // namespace gradd

// Call sites include this header and use spdlog's functions directly:
// spdlog::info("job '{}' ...", id). Debian's Abseil has its own string_view
// (not std::string_view), so fmt learns it and absl::Status here.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(s.data(), s.size()), ctx);
  }
};
template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(const absl::Status& s, Context& ctx) const {
    const std::string text = s.ToString();
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(text.data(), text.size()), ctx);
  }
};

#endif  // GRADD_SERVER_LOGGING_H_
