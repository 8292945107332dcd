// Death-test predicate for "this store hit a read-only or unmapped page":
// SIGSEGV in a plain build; under AddressSanitizer, which catches the fault,
// reports a SEGV and then aborts (abort_on_error=1, as scripts/test
// --sanitize sets) or exits non-zero.
#ifndef GRADD_TESTS_UNIT_COMMON_WRITE_FAULT_H_
#define GRADD_TESTS_UNIT_COMMON_WRITE_FAULT_H_

#include <signal.h>
#include <sys/wait.h>

namespace gradd::testing {

inline bool DiedOfWriteFault(int status) {
#ifdef __SANITIZE_ADDRESS__
  return (WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) ||
         (WIFEXITED(status) && WEXITSTATUS(status) != 0);
#else
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
#endif
}

// What the dying child prints: ASan names the SEGV; a plain build prints
// nothing.
#ifdef __SANITIZE_ADDRESS__
inline constexpr char kWriteFaultOutput[] = "SEGV";
#else
inline constexpr char kWriteFaultOutput[] = "";
#endif

}  // namespace gradd::testing

#endif  // GRADD_TESTS_UNIT_COMMON_WRITE_FAULT_H_
