// Tells the service manager how the daemon is doing: READY=1 once the
// sockets serve, WATCHDOG=1 while the control loop runs, STOPPING=1 when a
// stop begins (systemd's sd_notify protocol, Type=notify).
//
// ServiceNotifierInterface is what the daemon calls; SystemdNotifier sends
// to $NOTIFY_SOCKET through libsystemd and is a no-op without one (run by
// hand, in a container, in tests), so callers need not check. Every method
// is safe from any thread (sd_notify opens a socket per message) and never
// fails the caller: a lost notification is logged at debug and dropped.
#ifndef GRADD_SERVER_SYSTEMD_NOTIFY_H_
#define GRADD_SERVER_SYSTEMD_NOTIFY_H_

#include <memory>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradd {

class ServiceNotifierInterface {
 public:
  virtual ~ServiceNotifierInterface() = default;

  // The daemon serves: every socket is bound and answering. `status` is a
  // one-line summary for `systemctl status`.
  virtual void Ready(absl::string_view status) = 0;
  // The control loop is alive; called at WatchdogInterval().
  virtual void Watchdog() = 0;
  // An orderly stop began (SIGTERM/SIGINT).
  virtual void Stopping(absl::string_view status) = 0;
  // How often Watchdog() must be called; absl::InfiniteDuration() when the
  // service manager watches nothing (then Watchdog() need not be called).
  virtual absl::Duration WatchdogInterval() const = 0;
};

class SystemdNotifier final : public ServiceNotifierInterface {
 public:
  // Reads $NOTIFY_SOCKET and $WATCHDOG_USEC/$WATCHDOG_PID (sd_watchdog_enabled)
  // once. The interval is half of WATCHDOG_USEC, as systemd.service(5)
  // advises, so one late ping does not kill the daemon.
  static std::unique_ptr<SystemdNotifier> FromEnvironment();

  void Ready(absl::string_view status) override;
  void Watchdog() override;
  void Stopping(absl::string_view status) override;
  absl::Duration WatchdogInterval() const override { return interval_; }

  // Whether a service manager listens ($NOTIFY_SOCKET was set).
  bool enabled() const { return enabled_; }

 private:
  SystemdNotifier(bool enabled, absl::Duration interval)
      : enabled_(enabled), interval_(interval) {}
  void Send(const char* what, absl::string_view message);

  const bool enabled_;
  const absl::Duration interval_;
};

}  // namespace gradd

#endif  // GRADD_SERVER_SYSTEMD_NOTIFY_H_
