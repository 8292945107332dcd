// The differences between the torch versions gradd's torch.distributed
// backend builds against, in one place: torch 1.13 (Debian 12) and torch
// 2.x (Debian 13's 2.6).
//
// torch 1.13: a backend is a c10d::ProcessGroup subclass, bound in Python
//   as a subclass of torch.distributed.ProcessGroup; the creator's return
//   value is the group itself.
// torch 2.x: the ProcessGroup / Backend split. A backend is a c10d::Backend
//   subclass (torch._C._distributed_c10d.Backend in Python); torch wraps it
//   in a ProcessGroup of its own and routes each collective to the backend
//   registered for the tensors' device (gradd registers "cpu" only). 2.x
//   adds the coalesced _into_tensor collectives to the interface.
//
// Python 3.13 made Py_IsFinalizing public and dropped _Py_IsFinalizing.
//
// Any other torch is refused here at build time; module.cc refuses, at
// import, a torch other than the one built against (its C++ classes'
// layout would not match: a crash, not an error).
#ifndef GRADD_CLIENT_PYTHON_C10D_TORCH_COMPAT_H_
#define GRADD_CLIENT_PYTHON_C10D_TORCH_COMPAT_H_

#include <Python.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR == 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#elif TORCH_VERSION_MAJOR == 1 && TORCH_VERSION_MINOR >= 13
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#else
#error "gradd's torch.distributed backend supports torch 1.13 and 2.x"
#endif
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace gradd::c10d_backend::compat {

#if TORCH_VERSION_MAJOR == 2
// What ProcessGroupGradd derives from.
using BackendBase = c10d::Backend;
// Its Python base class: module and attribute.
inline constexpr char kPythonBaseModule[] = "torch._C._distributed_c10d";
inline constexpr char kPythonBaseClass[] = "Backend";
// Marks the collectives that torch 1.13's interface lacks (on 1.13 they are
// plain methods nobody calls).
#define GRADD_TORCH2_OVERRIDE override
#else
using BackendBase = c10d::ProcessGroup;
inline constexpr char kPythonBaseModule[] = "torch.distributed";
inline constexpr char kPythonBaseClass[] = "ProcessGroup";
#define GRADD_TORCH2_OVERRIDE
#endif

// Whether the interpreter is shutting down.
inline bool PythonFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace gradd::c10d_backend::compat

#endif  // GRADD_CLIENT_PYTHON_C10D_TORCH_COMPAT_H_
