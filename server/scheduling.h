// The daemon's CPU priority (config key `nice`).
//
// A gradd shares its node's cores with the trainers it serves. Its threads
// do little work per byte (the network carries most of the time) but sit on
// every training step's critical path: when the trainers' backward passes
// keep every core busy, a daemon thread at the same priority waits whole
// scheduler slices before it can hand the next segment to the network, and
// the link idles. Measured with scripts/netbench's compare_ddp model across
// 2 emulated nodes x 2 trainers on 2 cores (1 Gbit/s): 0.775 steps/s at the
// trainers' niceness, 0.848 at -10 (torch DDP: 0.56). The default is -10:
// ahead of ordinary processes. The configured value is applied as it is
// (a unit with a different Nice= should set `nice` to match).
//
// Lowering the niceness needs CAP_SYS_NICE. The shipped systemd unit sets
// Nice=-10 itself (systemd applies it before exec, so the hardened unit
// keeps no capability); a daemon run without either logs one warning and
// keeps the niceness it was started with.
#ifndef GRADD_SERVER_SCHEDULING_H_
#define GRADD_SERVER_SCHEDULING_H_

#include "absl/status/status.h"

namespace gradd {

// Sets the calling thread's niceness to `nice` (-20..19). Threads inherit their
// creator's niceness on Linux, so call it before the daemon starts any thread.
// PERMISSION_DENIED (without CAP_SYS_NICE) says so; nothing changes then.
absl::Status ApplyNiceness(int nice);

// The calling thread's niceness.
int CurrentNiceness();

}  // namespace gradd

#endif  // GRADD_SERVER_SCHEDULING_H_
