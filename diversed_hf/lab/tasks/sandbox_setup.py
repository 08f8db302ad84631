"""Stage 1 of a sandboxed run: contain this process, then exec the harness (``sandbox_harness``).

Not imported by the package: :mod:`diversed_hf.lab.tasks.sandbox` runs this file's text with
``python -I -B -c <text> <config json>`` (inside the namespaces when the mode has them), so it uses the
standard library only. It runs before any untrusted code, with the caller's privileges (root inside
the namespaces, or the caller itself), and in this order:

1. with a mount namespace: a private, size-limited tmpfs over ``/tmp``, with ``/var/tmp``, ``/dev/shm``
   and ``/run/lock`` bound to directories of it; the work directory is ``/tmp/work``; with an own uid,
   the interpreter's directories made reachable for it (``expose_interpreter``);
2. resource limits (address space, CPU time, file size, open files, core dumps, processes);
3. its own uid (when the config has one): supplementary groups, gid and uid dropped for good; a
   program that would stay uid 0 gets an empty capability bounding set instead;
4. ``no_new_privs``, then Landlock (writes only where the mode allows, reads everywhere but
   ``/proc`` without a PID namespace, no TCP, no abstract unix sockets or signals outside the run);
5. a seccomp filter (no sockets, ptrace, io_uring, mount changes, keyrings; see ``_denied_syscalls``);
6. ``execve`` of a fresh interpreter running the harness.

A failure at any step ends the run with exit status 125 and ``diversed_hf sandbox setup failed`` on
stderr, before the program has run. What each step gives is documented in docs/sandbox.md.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import stat
import sys

SETUP_FAILED = 125

# ------------------------------------------------------------------------------------------------
# Linux constants (uapi headers)

PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_RELATIME = 0x400, 0x800, 0x1000, 0x4000, 0x200000
ST_RELATIME = 0x1000  # statvfs's f_flag for relatime (the other flags share their MS_ values)

# Landlock: filesystem rights (bit i = ABI that introduced it), network rights (ABI 4), scopes (ABI 6).
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LL_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
LL_REFER, LL_TRUNCATE, LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
LL_MAKE_DEVICES = (1 << 6) | (1 << 11)  # make_char, make_block: handled, never granted
LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
LL_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect
LL_SCOPES = (1 << 0) | (1 << 1)  # abstract unix sockets, signals
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446

# seccomp: syscall numbers per architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h).
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# The two tables below keep one line per syscall family (`# fmt: skip`): one entry per line would run to 60 lines.
SYSCALLS = {
    # name: (x86_64, aarch64)
    "socket": (41, 198), "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438), "pidfd_send_signal": (424, 424),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51), "unshare": (272, 97),
    "setns": (308, 268), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "shmget": (29, 194), "semget": (64, 190), "msgget": (68, 186), "mq_open": (240, 180),
    "memfd_create": (319, 279), "memfd_secret": (447, 447),
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
}  # fmt: skip
ALWAYS_DENIED = (
    "socket", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "pidfd_send_signal",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "mount", "umount2", "pivot_root", "chroot",
    "unshare", "setns", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
)  # fmt: skip
# memory that RLIMIT_AS does not count once unmapped (memfd files, System V segments and message queues): refused
# in every mode, IPC namespace or not, so that memory_mb bounds what a process holds (docs/sandbox.md)
MEMORY_OUTSIDE_RLIMIT = ("memfd_create", "memfd_secret", "shmget", "msgget")
IPC_CREATION = ("semget", "mq_open")  # objects that outlive a run without an IPC namespace
SIGNALLING = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")  # target pid in argument 0

EPERM, ENOSYS = 1, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _syscall(number: int, *args) -> int:
    """``syscall(2)``; integers are widened to ``long`` (a variadic call would pass them as ``int``)."""
    return _libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])


def _prctl(option: int, *args) -> int:
    return _libc.prctl(ctypes.c_int(option), *[ctypes.c_ulong(a) if isinstance(a, int) else a for a in args])


# ------------------------------------------------------------------------------------------------
# 1. a private /tmp


def interpreter_paths() -> list:
    """The directories this interpreter needs (its own directory, its prefixes), outermost ones only."""
    needed = {
        os.path.realpath(p)
        for p in (
            os.path.dirname(os.path.realpath(sys.executable)),
            sys.prefix,
            sys.base_prefix,
            sys.exec_prefix,
            sys.base_exec_prefix,
        )
        if p
    }
    return [p for p in sorted(needed) if not any(p.startswith(q + "/") for q in needed)]


def _mask(directory: str, keep: list, options: bytes) -> None:
    """Mount a tmpfs over ``directory`` and bind the directories ``keep`` (beneath it) back in, read-only."""
    fds = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in keep}
    _check(
        _libc.mount(b"tmpfs", directory.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options),
        f"mounting a tmpfs on {directory}",
    )
    for path, fd in fds.items():
        os.makedirs(path, 0o755, exist_ok=True)
        _check(
            _libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None), f"binding {path}"
        )
        os.close(fd)
        # keep the flags a user namespace may not clear (nosuid, nodev, noexec, atime) and add read-only
        flags = os.statvfs(path).f_flag
        kept = (flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)) | (
            MS_RELATIME if flags & ST_RELATIME else 0
        )
        _check(
            _libc.mount(None, path.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept, None), f"{path} read-only"
        )


def private_tmp(size: int, uid: int) -> str:
    """Mount a tmpfs of ``size`` bytes over /tmp (this mount namespace only), bind /var/tmp, /dev/shm, /run/lock to it.

    An interpreter that lives under /tmp (a venv made there) is bound back in, read-only.
    """
    _mask("/tmp", [p for p in interpreter_paths() if p.startswith("/tmp/")], f"size={size},mode=1777".encode())
    for target, inside in (("/var/tmp", "/tmp/.var-tmp"), ("/dev/shm", "/tmp/.shm"), ("/run/lock", "/tmp/.run-lock")):
        if os.path.isdir(target) and not os.path.islink(target):
            os.mkdir(inside)
            os.chmod(inside, 0o1777)
            _check(_libc.mount(inside.encode(), target.encode(), None, MS_BIND | MS_REC, None), f"binding {target}")
    os.mkdir("/tmp/work", 0o700)
    os.chown("/tmp/work", uid, uid)
    return "/tmp/work"


def _searchable_by(path: str, uid: int) -> bool:
    """Whether ``uid`` (no supplementary groups, gid == uid) may traverse the directory ``path``."""
    info = os.stat(path)
    bit = 0o100 if info.st_uid == uid else 0o010 if info.st_gid == uid else 0o001
    return bool(info.st_mode & bit)


def expose_interpreter(uid: int) -> None:
    """Make this interpreter, its prefixes and libraries reachable by ``uid`` in this mount namespace.

    An interpreter under a private directory (``/root/.pyenv``, a ``0750`` home) cannot be executed by
    another uid. Each such outermost private ancestor gets an empty tmpfs (``0755``) mounted over it,
    with only the interpreter's directories bound back in, read-only: the rest of it stays hidden.
    """
    blocked: dict = {}  # outermost private ancestor -> the needed directories beneath it
    for path in interpreter_paths():
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if not _searchable_by(ancestor, uid):
                blocked.setdefault(ancestor, []).append(path)
                break
    for ancestor, paths in blocked.items():
        _mask(ancestor, paths, b"size=1m,mode=0755")


# ------------------------------------------------------------------------------------------------
# 2. limits and 3. uid


def _tasks_of(uid: int) -> int:
    """Tasks (threads) that ``uid`` runs now, as RLIMIT_NPROC counts them."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as handle:
                    fields = dict(line.split(":", 1) for line in handle if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    count += int(fields["Threads"])
            except (OSError, KeyError, ValueError):
                continue
    return count


def set_limits(config: dict) -> None:
    for name, value in (
        ("RLIMIT_AS", config["memory"]),
        ("RLIMIT_FSIZE", config["file_size"]),
        ("RLIMIT_NOFILE", config["open_files"]),
        ("RLIMIT_CORE", 0),
    ):
        resource.setrlimit(getattr(resource, name), (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (config["cpu_seconds"], config["cpu_seconds"] + 1))
    processes = config["processes"]
    if config["processes_relative"]:  # RLIMIT_NPROC counts every task of the uid: leave room for the others
        processes += _tasks_of(os.getuid() if config["uid"] is None else config["uid"]) - 1
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))


def drop_capabilities() -> None:
    """For a program that stays uid 0 (the user-namespace mode, or plain mode run by root): an empty
    bounding set, so the ``execve`` of the harness leaves it without any capability."""
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    capability = 0
    while _prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) == 0:
        capability += 1
    if capability == 0:
        raise OSError(ctypes.get_errno(), "could not drop the capability bounding set")


def drop_uid(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"still uid {os.geteuid()} after dropping to {uid}")


# ------------------------------------------------------------------------------------------------
# 4. Landlock


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _fs_rights(abi: int) -> int:
    rights = LL_FS_ABI1
    rights |= LL_REFER if abi >= 2 else 0
    rights |= LL_TRUNCATE if abi >= 3 else 0
    rights |= LL_IOCTL_DEV if abi >= 5 else 0
    return rights


def landlock(abi: int, writable: list, hide_proc: bool) -> None:
    """Reads and execution everywhere (``/proc`` left out when ``hide_proc``), writes only beneath ``writable``."""
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled, LL_NET_TCP if abi >= 4 else 0, LL_SCOPES if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _check(_syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0), "landlock_create_ruleset")
    read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
    rules = []
    if hide_proc:
        rules += [(os.path.join("/", name), read) for name in os.listdir("/") if name != "proc"]
    else:
        rules.append(("/", read))
    rules += [(path, handled & ~LL_MAKE_DEVICES) for path in writable]
    rules.append((os.devnull, handled & (LL_READ_FILE | LL_WRITE_FILE | LL_TRUNCATE | LL_IOCTL_DEV)))
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a dangling top-level symlink: nothing to grant
        try:
            if os.path.realpath(f"/proc/self/fd/{fd}").startswith("/proc") and hide_proc:
                continue
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= LL_FILE_RIGHTS
            rule = _PathBeneath(rights & handled, fd)
            _check(_syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0), f"landlock rule for {path}")
        finally:
            os.close(fd)
    _check(_syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    os.close(ruleset)


# ------------------------------------------------------------------------------------------------
# 5. seccomp


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine: str, deny_ipc: bool, signal_self_only: int | None) -> list:
    """The BPF filter: ``EPERM`` for the denied syscalls, ``ENOSYS`` for other ABIs (i386, x32).

    With ``signal_self_only`` (this process's pid, which is also its process group and session),
    ``kill``-like calls may target only pid 0, that pid or its group.
    """
    index = 0 if machine == "x86_64" else 1
    program = [
        (BPF_LD_W_ABS, 0, 0, 4),
        (BPF_JEQ_K, 1, 0, AUDIT_ARCH[machine]),
        (BPF_RET_K, 0, 0, RET_ERRNO | ENOSYS),
        (BPF_LD_W_ABS, 0, 0, 0),
    ]
    if machine == "x86_64":  # x32 syscalls carry bit 30
        program += [(BPF_JGE_K, 0, 1, 0x40000000), (BPF_RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    for name in ALWAYS_DENIED + MEMORY_OUTSIDE_RLIMIT + (IPC_CREATION if deny_ipc else ()):
        program += [(BPF_JEQ_K, 0, 1, SYSCALLS[name][index]), (BPF_RET_K, 0, 0, RET_ERRNO | EPERM)]
    if signal_self_only is not None:
        own, group = signal_self_only, (-signal_self_only) & 0xFFFFFFFF
        for name in SIGNALLING:
            program += [
                (BPF_JEQ_K, 0, 6, SYSCALLS[name][index]),
                (BPF_LD_W_ABS, 0, 0, 16),  # the low 32 bits of argument 0: the pid (little-endian)
                (BPF_JEQ_K, 3, 0, 0),
                (BPF_JEQ_K, 2, 0, own),
                (BPF_JEQ_K, 1, 0, group),
                (BPF_RET_K, 0, 0, RET_ERRNO | EPERM),
                (BPF_RET_K, 0, 0, RET_ALLOW),
            ]
    return program + [(BPF_RET_K, 0, 0, RET_ALLOW)]


def seccomp(program: list) -> None:
    filters = (_SockFilter * len(program))(*[_SockFilter(*instruction) for instruction in program])
    fprog = _SockFprog(len(program), filters)
    _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "installing the seccomp filter")


# ------------------------------------------------------------------------------------------------


def main(config: dict) -> None:
    uid = config["uid"]
    workdir = private_tmp(config["tmp_size"], 0 if uid is None else uid) if config["namespaces"] else config["workdir"]
    if config["namespaces"] and uid is not None:
        expose_interpreter(uid)
    set_limits(config)
    if uid is not None:
        drop_uid(uid)
    elif os.geteuid() == 0 and sys.platform.startswith("linux"):
        drop_capabilities()
    os.chdir(workdir)
    if config["landlock"] or config["seccomp"]:
        _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if config["landlock"]:
        writable = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock"] if config["namespaces"] else [workdir]
        landlock(config["landlock"], [p for p in writable if os.path.isdir(p)], hide_proc=not config["namespaces"])
    if config["seccomp"]:
        signal_self_only = os.getpid() if config["signal_self_only"] else None
        seccomp(seccomp_program(platform.machine(), not config["namespaces"], signal_self_only))
    env = dict(config["env"], HOME=workdir, TMPDIR=workdir)
    os.execve(sys.executable, [sys.executable, "-I", "-B", "-c", config["harness"], str(config["result_fd"])], env)


if __name__ == "__main__":
    try:
        main(json.loads(sys.argv[1]))
    except BaseException as error:  # noqa: BLE001 - anything here is a setup failure, reported as such
        os.write(2, f"diversed_hf sandbox setup failed: {type(error).__name__}: {error}\n".encode(errors="replace"))
        os._exit(SETUP_FAILED)
