#include "server/scheduling.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradd {

int CurrentNiceness() {
  errno = 0;
  return getpriority(PRIO_PROCESS, 0);  // Linux: this thread
}

int LowerThreadPriorityTo(int floor) {
  const int current = CurrentNiceness();
  if (current >= floor) return current;
  // Linux: PRIO_PROCESS with 0 is this thread only.
  if (setpriority(PRIO_PROCESS, 0, floor) != 0) return current;
  return CurrentNiceness();
}

absl::Status ApplyNiceness(int nice) {
  if (nice < -20 || nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("nice = ", nice, " is outside [-20, 19]"));
  }
  const int current = CurrentNiceness();
  if (current == nice) return absl::OkStatus();
  if (setpriority(PRIO_PROCESS, 0, nice) != 0) {
    const int err = errno;
    const std::string why =
        absl::StrCat("cannot set the daemon's niceness from ", current, " to ",
                     nice, ": ", std::strerror(err));
    if (err == EPERM || err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat(
          why, " (needs CAP_SYS_NICE, or Nice= in the systemd unit)"));
    }
    return absl::InternalError(why);
  }
  return absl::OkStatus();
}

}  // namespace gradd
