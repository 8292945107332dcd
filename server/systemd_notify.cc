#include "server/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/logging.h"

namespace gradd {

std::unique_ptr<SystemdNotifier> SystemdNotifier::FromEnvironment() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  const bool enabled = socket != nullptr && socket[0] != '\0';
  absl::Duration interval = absl::InfiniteDuration();
  uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is us.
  if (enabled && sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 &&
      usec > 0) {
    interval = absl::Microseconds(usec) / 2;
  }
  return std::unique_ptr<SystemdNotifier>(
      new SystemdNotifier(enabled, interval));
}

void SystemdNotifier::Send(const char* what, absl::string_view message) {
  if (!enabled_) return;
  const int rc =
      sd_notify(/*unset_environment=*/0, std::string(message).c_str());
  if (rc < 0) {
    spdlog::debug("sd_notify {}: {}", what, std::strerror(-rc));
  }
}

void SystemdNotifier::Ready(absl::string_view status) {
  // STATUS is one line of the datagram: no newline may end it early.
  Send("READY", absl::StrCat("READY=1\nSTATUS=",
                             absl::StrReplaceAll(status, {{"\n", " "}})));
}

void SystemdNotifier::Watchdog() { Send("WATCHDOG", "WATCHDOG=1"); }

void SystemdNotifier::Stopping(absl::string_view status) {
  Send("STOPPING", absl::StrCat("STOPPING=1\nSTATUS=",
                                absl::StrReplaceAll(status, {{"\n", " "}})));
}

}  // namespace gradd
