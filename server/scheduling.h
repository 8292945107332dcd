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
//
// One exception: the engine thread of a single-node job (engine/job/job.h)
// runs at the trainers' niceness, kTrainerNiceness (or the configured one,
// if that is higher). It has no network to feed, and every local bucket's
// hand-over is a meeting of the trainers and that thread: ahead of them it
// preempts the rank that just rang its bell, and its doorbell spin keeps
// the rank that shares its core off the CPU for the whole spin (a
// sched_yield() does not give a core to a lower-priority thread). With 2
// trainers on 2 cores that tripled the 4 KiB hand-over (issue 21:
// gradd-bench p50 7.3 us at 7e4cb1b, 24.5 us with the thread at -10, 8.7 us
// at the trainers' niceness).
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

// The niceness of an ordinary process (the trainers').
inline constexpr int kTrainerNiceness = 0;

// Lowers the calling thread's priority to niceness `floor` if it runs
// ahead of it (raising the value needs no privilege); a thread at or above
// `floor` keeps its niceness. Returns the thread's niceness afterwards.
int LowerThreadPriorityTo(int floor);

}  // namespace gradd

#endif  // GRADD_SERVER_SCHEDULING_H_
