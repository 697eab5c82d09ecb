"""Denying ``memfd_create`` with a seccomp filter: the sandbox's memory bound where no cgroup can be made.

Without a memory cgroup (`omrl.sandbox.cgroup`) the run's memory is bounded by rlimits on each
process's address space, and an in-memory file written with ``write`` is in no address space: it
escapes them. So where the helper finds no cgroup, the program gets this filter, and
``memfd_create`` fails with EPERM; the other in-memory files are closed off by the helper too (no
System V IPC; the scratch tmpfs is bounded by ``disk_mb``). Used by `omrl.sandbox.child`, on the
base Python with only the standard library.
"""

from __future__ import annotations

import ctypes
import errno
import platform

# From <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h> and <linux/prctl.h>.
_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_X32_BIT = 0x40000000  # x86-64's x32 calls: the same numbers with this bit set
# machine -> (the audit arch that seccomp reports for it, memfd_create's number there)
_ARCHES = {"x86_64": (0xC000003E, 319), "aarch64": (0xC00000B7, 279)}


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def deny_memfd() -> None:
    """From now on (and across exec, in every child) ``memfd_create`` fails with EPERM; so does
    every call of another architecture's ABI (a 32-bit program), whose numbers differ. Needs
    ``no_new_privs`` already set; raises OSError when the kernel or this machine cannot do it."""
    machine = platform.machine()
    if machine not in _ARCHES:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {machine}: the sandbox knows x86_64 and aarch64")
    arch, memfd_create = _ARCHES[machine]
    deny = _RET_ERRNO | errno.EPERM
    rules = [
        (_LD_ABS_W, 0, 0, 4),  # the call's architecture
        (_JEQ_K, 1, 0, arch),
        (_RET_K, 0, 0, deny),
        (_LD_ABS_W, 0, 0, 0),  # the call's number
        (_JGE_K, 2, 0, _X32_BIT) if machine == "x86_64" else (_JEQ_K, 2, 0, 0xFFFFFFFF),
        (_JEQ_K, 1, 0, memfd_create),
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, deny),
    ]
    instructions = (_Instruction * len(rules))(*(_Instruction(*rule) for rule in rules))
    program = _Program(len(rules), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"seccomp filter: {errno.errorcode.get(number, number)}")
