#include "server/logging.h"

#include <sys/stat.h>

#include <cstdlib>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/client_strings.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/sinks/sink.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/sinks/systemd_sink.h"

namespace gradd {
namespace {

// Escapes each line's text (EscapeForLog, common/client_strings.h) before
// the real sink writes it. Client strings reach log lines (job ids,
// parameter names, error messages quoting them); whatever they hold, one
// log call stays one line of text, so no client can forge a line of the
// daemon's log or drive the terminal of whoever reads it.
class EscapingSink final : public spdlog::sinks::sink {
 public:
  explicit EscapingSink(std::shared_ptr<spdlog::sinks::sink> inner)
      : inner_(std::move(inner)) {}

  void log(const spdlog::details::log_msg& msg) override {
    const absl::string_view text(msg.payload.data(), msg.payload.size());
    if (!NeedsEscapeForLog(text)) {
      inner_->log(msg);
      return;
    }
    const std::string escaped = EscapeForLog(text);
    spdlog::details::log_msg copy = msg;
    copy.payload = spdlog::string_view_t(escaped.data(), escaped.size());
    inner_->log(copy);
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override {
    inner_->set_pattern(pattern);
  }
  void set_formatter(std::unique_ptr<spdlog::formatter> formatter) override {
    inner_->set_formatter(std::move(formatter));
  }

 private:
  const std::shared_ptr<spdlog::sinks::sink> inner_;
};

// Protobuf's own messages (e.g. a string field that is not UTF-8 when
// serializing) go to the daemon's log like every other line, instead of
// protobuf's default raw stderr line.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO:
      spdlog::info("protobuf ({}:{}): {}", file, line, message);
      return;
    case google::protobuf::LOGLEVEL_WARNING:
      spdlog::warn("protobuf ({}:{}): {}", file, line, message);
      return;
    default:
      spdlog::error("protobuf ({}:{}): {}", file, line, message);
  }
}

absl::StatusOr<spdlog::level::level_enum> ParseLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "trace") return spdlog::level::trace;
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warning" || lower == "warn") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  if (lower == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown log level '", name, "' (expected one of: ", kLogLevels, ")"));
}

}  // namespace

absl::Status ValidateLogLevel(absl::string_view level) {
  return ParseLevel(level).status();
}

bool StderrIsJournal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  std::pair<std::string, std::string> parts =
      absl::StrSplit(stream, absl::MaxSplits(':', 1));
  unsigned long long dev = 0, ino = 0;
  if (!absl::SimpleAtoi(parts.first, &dev) ||
      !absl::SimpleAtoi(parts.second, &ino)) {
    return false;
  }
  struct stat st;
  if (fstat(2, &st) != 0) return false;
  return st.st_dev == dev && st.st_ino == ino;
}

absl::Status InitLogging(absl::string_view level, LogDestination destination) {
  absl::StatusOr<spdlog::level::level_enum> parsed = ParseLevel(level);
  if (!parsed.ok()) return parsed.status();
  if (destination == LogDestination::kAuto) {
    destination =
        StderrIsJournal() ? LogDestination::kJournal : LogDestination::kStderr;
  }
  std::shared_ptr<spdlog::logger> logger;
  if (destination == LogDestination::kJournal) {
    // The journal stamps time and unit itself; SYSLOG_IDENTIFIER "gradd".
    auto sink = std::make_shared<spdlog::sinks::systemd_sink_mt>("gradd");
    logger = std::make_shared<spdlog::logger>(
        "gradd", std::make_shared<EscapingSink>(std::move(sink)));
    logger->set_pattern("%v");
  } else {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    logger = std::make_shared<spdlog::logger>(
        "gradd", std::make_shared<EscapingSink>(std::move(sink)));
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %L gradd: %v",
                        spdlog::pattern_time_type::utc);
  }
  logger->set_level(*parsed);
  // Warnings and errors reach the journal (or the pipe) at once; info lines
  // are flushed by the stderr sink's own line writes.
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
  google::protobuf::SetLogHandler(&ProtobufLog);
  return absl::OkStatus();
}

}  // namespace gradd
