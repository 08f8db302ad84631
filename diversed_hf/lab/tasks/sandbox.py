"""Run untrusted generated code (MBPP-style pass@1) in a separate, contained process.

:func:`run_program` runs a program and its tests and says whether they passed. What it enforces
depends on the mode this machine allows (:func:`sandbox_mode`, the strongest one that works here;
:func:`available_modes` lists them all): ``namespaces`` (root: PID, network, mount and IPC
namespaces, a private size-limited ``/tmp``, its own uid), ``user-namespace`` (the same namespaces
through an unprivileged user namespace, the caller's uid), ``own-uid`` (root without namespaces: its
own uid) and ``plain`` (neither). Landlock and a seccomp filter are added where the kernel has them.
**The guarantees of each mode, and what none of them covers, are written in one place:
docs/sandbox.md.**

How a run works: ``sandbox_setup`` (stage 1) contains the process and execs ``sandbox_harness``
(stage 2), which reads a per-run nonce and the program from stdin, runs the program and its tests in
its own interpreter, and writes the nonce to a private pipe only when they ran to their end. A run
passes when that nonce arrives and the process exits 0, within the wall-clock ``timeout``.

This is a guard against the accidents and shortcuts of generated code, not a security boundary
against code written to escape it: run hostile code in a container or a VM.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import numbers
import os
import platform
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .sandbox_files import remove_workdir, sweep_uid

logger = logging.getLogger(__name__)

__all__ = ["SandboxMode", "available_modes", "run_program", "sandbox_mode", "sandbox_network_mode"]

OUTPUT_TAIL_BYTES = 8 * 1024  # of stdout and of stderr: only the reason for a failure is read from them
MAX_PROCESSES = 8  # RLIMIT_NPROC: tasks (threads included) of a run; memory in all <= MAX_PROCESSES * memory_mb
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # RLIMIT_FSIZE, per file
TMP_SIZE_LIMIT = 64 * 1024 * 1024  # the private /tmp (a tmpfs: RAM) of the namespace modes, all files together
OPEN_FILES = 64
MAX_TIMEOUT = 24 * 3600  # seconds
MAX_MEMORY_MB = 1 << 24  # 16 TiB per process: RLIMIT_AS in bytes must stay below 2**63
MODE_NAMES = ("namespaces", "user-namespace", "own-uid", "plain")  # strongest first
SETUP_FAILED = 125  # the exit status of sandbox_setup when it could not contain the process
_EXIT_GRACE = 1.0  # seconds to drain pipes still held open after the run's process exited
# One uid per concurrent run (RLIMIT_NPROC counts per uid), from a per-process offset so that two
# processes running sandboxes rarely share one.
_UIDS = itertools.islice(itertools.cycle(range(61000, 61256)), os.getpid() % 256, None)
_UID_LOCK = threading.Lock()
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SandboxMode:
    """Which protections :func:`run_program` has; docs/sandbox.md says what each one enforces."""

    name: str  # one of MODE_NAMES
    namespaces: bool  # PID, network, mount, IPC and UTS namespaces; a private tmpfs on /tmp
    own_uid: bool  # runs under a uid of its own (61000-61255), not the caller's
    landlock: int  # the Landlock ABI applied (0: none)
    seccomp: bool  # the seccomp filter of sandbox_setup
    prefix: tuple[str, ...] = ()  # the command that enters the namespaces
    python: str = sys.executable  # the interpreter that runs the programs

    @property
    def pid_namespace(self) -> bool:
        return self.namespaces

    @property
    def network_namespace(self) -> bool:
        return self.namespaces

    @property
    def user_namespace(self) -> bool:
        return self.name == "user-namespace"

    def describe(self) -> str:
        parts = ["pid-ns", "net-ns", "mount-ns", "ipc-ns"] if self.namespaces else []
        parts += ["userns"] if self.user_namespace else []
        parts += ["own-uid"] if self.own_uid else []
        parts += [f"landlock-v{self.landlock}"] if self.landlock else []
        parts += ["seccomp"] if self.seccomp else []
        return f"{self.name} (" + "+".join(parts + ["audit"]) + ")"


# ------------------------------------------------------------------------------------------------
# What this machine allows


def _landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock (or off Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        version = libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))  # ..._VERSION flag
    except (OSError, AttributeError):
        return 0
    return max(0, int(version))


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


def _candidate(name: str) -> SandboxMode | None:
    """``name``'s mode with every layer this machine may have, or None when it clearly cannot work."""
    linux = sys.platform.startswith("linux")
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    unshare = shutil.which("unshare") if linux else None
    layers = dict(landlock=_landlock_abi(), seccomp=linux and platform.machine() in ("x86_64", "aarch64"))
    namespaces = ("--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc")
    if name == "namespaces" and root and unshare:
        return SandboxMode(name, True, True, prefix=(unshare, *namespaces), **layers)
    if name == "user-namespace" and unshare:
        return SandboxMode(name, True, False, prefix=(unshare, "--user", "--map-root-user", *namespaces), **layers)
    if name == "own-uid" and root:
        return SandboxMode(name, False, True, **layers)
    if name == "plain":
        return SandboxMode(name, False, False, **layers)
    if name not in MODE_NAMES:
        raise ValueError(f"Unknown sandbox mode {name!r}; the modes are {', '.join(MODE_NAMES)}.")
    return None


_PROBES: dict[str, SandboxMode | None] = {}
_PROBE_LOCK = threading.Lock()  # pass_at_1's threads all start with sandbox_mode(): probe once


def _working_mode(name: str) -> SandboxMode | None:
    """``name``'s mode if a trivial program passes in it (with all layers, else without Landlock and seccomp)."""
    with _PROBE_LOCK:
        if name not in _PROBES:
            _PROBES[name] = _probe(name)
        return _PROBES[name]


def _probe(name: str) -> SandboxMode | None:
    mode = _candidate(name)
    if mode is None:
        return None
    first_reason = ""
    for attempt in (mode, replace(mode, landlock=0, seccomp=False)):
        try:
            passed, reason = _run(b"pass", timeout=30, memory_mb=256, mode=attempt, probing=True)
        except Exception as error:  # noqa: BLE001 - a mode that cannot start is a mode this machine lacks
            passed, reason = False, repr(error)
        if passed:
            if attempt is not mode:
                logger.warning("The %s sandbox works here only without Landlock and seccomp (%s).", name, first_reason)
            return attempt
        first_reason = reason
    logger.info("The %s sandbox does not work on this machine: %s", name, first_reason)
    return None


def available_modes() -> dict[str, SandboxMode]:
    """Every mode that works on this machine, strongest first (each probed once per process)."""
    return {name: mode for name in MODE_NAMES if (mode := _working_mode(name)) is not None}


def sandbox_mode() -> SandboxMode:
    """The strongest mode that works on this machine (probed once per process)."""
    for name in MODE_NAMES:
        mode = _working_mode(name)
        if mode is not None:
            return mode
    return replace(_candidate("plain"), landlock=0, seccomp=False)


def sandbox_network_mode() -> str:
    """``"netns+audit"`` when programs get an empty network namespace, else ``"audit"`` (the hook alone)."""
    return "netns+audit" if sandbox_mode().network_namespace else "audit"


@functools.lru_cache(maxsize=None)
def _warn_once(description: str) -> None:
    logger.warning(
        "The code sandbox runs in mode %s: without namespaces a program shares this machine's process table, "
        "network and /tmp with the caller (docs/sandbox.md lists what is still enforced). Run untrusted code in a "
        "container.",
        description,
    )


@functools.lru_cache(maxsize=None)
def _stage_source(name: str) -> str:
    return (_HERE / f"{name}.py").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# One run


def run_program(
    source: str, *, timeout: float = 10.0, memory_mb: int = 1024, mode: SandboxMode | None = None
) -> tuple[bool, str]:
    """Run ``source`` (a program followed by its tests) in the sandbox; ``(passed, reason)``.

    ``passed`` means the program and its tests ran to their end without an exception and the process
    exited with status 0 within ``timeout`` wall-clock seconds. ``reason`` is ``"passed"``,
    ``"timeout"``, the last line of the program's stderr (an exception), or says what else ended it.
    ``memory_mb`` limits each process's address space (see docs/sandbox.md for the total); ``mode``
    forces one of :func:`available_modes` (default :func:`sandbox_mode`). Never raises because of what
    the program did: a program that tampers with its work directory scores ``False``.
    """
    if not isinstance(source, str):
        raise TypeError(f"`source` must be a str (a Python program), got {type(source).__name__}.")
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"`timeout` must be seconds in (0, {MAX_TIMEOUT}] (a day), got {timeout!r}.")
    if (
        isinstance(memory_mb, bool)
        or not isinstance(memory_mb, numbers.Integral)
        or not 64 <= memory_mb <= MAX_MEMORY_MB
    ):
        raise ValueError(
            f"`memory_mb` must be an integer in [64, {MAX_MEMORY_MB}] (the interpreter needs 64; the most the kernel's "
            f"address-space limit takes is 2**{MAX_MEMORY_MB.bit_length() - 1} MiB), got {memory_mb!r}."
        )
    timeout, memory_mb = float(timeout), int(memory_mb)
    if mode is None:
        mode = sandbox_mode()
        if not mode.namespaces:
            _warn_once(mode.describe())
    elif not isinstance(mode, SandboxMode):
        raise TypeError(f"`mode` must be a SandboxMode from `available_modes()`, got {mode!r}.")
    # Lone surrogates cannot be compiled; as escapes they keep their value inside string literals.
    return _run(source.encode("utf-8", "backslashreplace"), timeout=timeout, memory_mb=memory_mb, mode=mode)


# It acquires the run's resources (uid, work directory, result pipe, child process) and releases every one of them in
# its own `finally`, in order: the acquisitions stay in this one function (split across functions, a failure between
# two of them could leak one); what needs no release (the setup's settings, the verdict) is read elsewhere.
def _run(
    program: bytes, *, timeout: float, memory_mb: int, mode: SandboxMode, probing: bool = False
) -> tuple[bool, str]:
    uid = None
    if mode.own_uid:
        with _UID_LOCK:
            uid = next(_UIDS)
    nonce = secrets.token_hex(32).encode()
    workdir = workdir_fd = result_read = None
    intact = True
    try:
        try:
            if not mode.namespaces:  # the program's cwd, HOME and TMPDIR on this machine's /tmp
                workdir = tempfile.mkdtemp(prefix="diversed_sandbox_")
                workdir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                if uid is not None:
                    os.chown(workdir, uid, uid)
            result_read, result_write = os.pipe()
        except OSError as error:
            logger.error("The code sandbox could not prepare a run: %s", error)
            if workdir is not None and workdir_fd is None:
                os.rmdir(workdir)
            return False, f"the sandbox could not start: {error}"
        config = _setup_config(mode, workdir, uid, memory_mb, timeout, result_write)
        command = [*mode.prefix, mode.python, "-I", "-B", "-c", _stage_source("sandbox_setup"), json.dumps(config)]
        try:
            process = subprocess.Popen(
                command,
                cwd=workdir or "/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(result_write,),
                start_new_session=True,
            )
        except OSError as error:
            logger.error("The code sandbox could not start a process: %s", error)
            return False, f"the sandbox could not start: {error}"
        finally:
            os.close(result_write)
        outcome = _communicate(process, nonce + b"\n" + program, result_read, nonce, timeout, mode, uid)
    finally:
        if result_read is not None:
            os.close(result_read)
        if workdir_fd is not None:
            intact = remove_workdir(workdir, workdir_fd)
        if uid is not None and not mode.namespaces:
            sweep_uid(uid)
    return _verdict(process, outcome, intact, mode, probing)


def _setup_config(mode: SandboxMode, workdir, uid, memory_mb: int, timeout: float, result_write: int) -> dict:
    """What the child's setup stage reads (``sandbox_setup``): limits, isolation, the result pipe, the harness."""
    return {
        "namespaces": mode.namespaces,
        "workdir": workdir,
        "uid": uid,
        "memory": memory_mb * 1024 * 1024,
        "cpu_seconds": max(1, int(timeout) + 1),
        "file_size": FILE_SIZE_LIMIT,
        "open_files": OPEN_FILES,
        "processes": MAX_PROCESSES,
        "tmp_size": TMP_SIZE_LIMIT,
        # RLIMIT_NPROC counts every task of a uid; per user namespace only since Linux 5.14
        "processes_relative": mode.name == "plain" or (mode.user_namespace and not _kernel_at_least(5, 14)),
        "landlock": mode.landlock,
        "seccomp": mode.seccomp,
        # without a PID namespace, an own uid or Landlock's signal scope, only seccomp keeps signals in the run
        "signal_self_only": not mode.namespaces and not mode.own_uid and mode.landlock < 6,
        "result_fd": result_write,
        "harness": _stage_source("sandbox_harness"),
        "env": {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        },
    }


def _verdict(process, outcome, intact: bool, mode: SandboxMode, probing: bool) -> tuple[bool, str]:
    """``(passed, reason)`` of a finished run from its process, its outcome and its work directory's state."""
    timed_out, finished, stderr = outcome
    if timed_out:
        return False, "timeout"
    if not intact:
        return False, "the program replaced or moved its work directory"
    if finished and process.returncode == 0:
        return True, "passed"
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    setup_failed = (
        process.returncode == SETUP_FAILED and lines and lines[-1].startswith("diversed_hf sandbox setup failed")
    )
    if setup_failed and not probing:
        logger.error("The code sandbox (%s) failed before running the program: %s", mode.describe(), lines[-1])
    if lines:
        return False, lines[-1]
    if process.returncode == 0:
        return False, "exited before the end"
    if process.returncode is None or process.returncode < 0:
        return False, f"killed by signal {-(process.returncode or -9)}"
    return False, f"exit status {process.returncode}"


def _communicate(process, payload: bytes, result_fd: int, nonce: bytes, timeout: float, mode, uid):
    """Feed stdin, drain stdout / stderr into tails and the result pipe into a nonce search, until the end.

    Returns ``(timed_out, nonce_seen, stderr_tail)``. The whole process tree is killed as soon as the
    run's process exits or the deadline passes; pipes still open after that are drained for at most
    ``_EXIT_GRACE`` seconds.
    """
    deadline = time.monotonic() + timeout
    stdin, stdout, stderr = process.stdin.fileno(), process.stdout.fileno(), process.stderr.fileno()
    tails = {stdout: bytearray(), stderr: bytearray()}
    scanned = bytearray()
    seen = timed_out = False
    ended_at = None
    os.set_blocking(stdin, False)
    selector = selectors.DefaultSelector()
    for fd in (stdout, stderr, result_fd):
        selector.register(fd, selectors.EVENT_READ)
    selector.register(stdin, selectors.EVENT_WRITE)
    sent = 0
    try:
        while selector.get_map():
            now = time.monotonic()
            if ended_at is None and now >= deadline:
                timed_out, ended_at = True, now
                _kill(process, mode, uid)
            if ended_at is not None and now - ended_at > _EXIT_GRACE:
                break
            for key, _ in selector.select(timeout=0.05):
                fd = key.fd
                if fd == stdin:
                    try:
                        sent += os.write(stdin, payload[sent : sent + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:  # the program ended or closed it: nothing more to feed
                        sent = len(payload)
                    if sent >= len(payload):
                        selector.unregister(stdin)
                        process.stdin.close()
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    selector.unregister(fd)
                elif fd == result_fd:
                    scanned += chunk
                    seen = seen or nonce in scanned
                    del scanned[: max(0, len(scanned) - len(nonce))]
                else:
                    tail = tails[fd]
                    tail += chunk
                    del tail[: max(0, len(tail) - OUTPUT_TAIL_BYTES)]
            if ended_at is None and _has_exited(process):
                ended_at = time.monotonic()
                _kill(process, mode, uid)  # at exit too: nothing the program started outlives the run
    finally:
        selector.close()
        if ended_at is None:
            _kill(process, mode, uid)
        for stream in (process.stdin, process.stdout, process.stderr):
            try:
                stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logger.error("A sandboxed process (pid %d) did not end after SIGKILL.", process.pid)
    return timed_out, seen, bytes(tails[stderr])


def _has_exited(process) -> bool:
    """Whether the run's process has exited, without reaping it (its pid, and so its group, stays reserved)."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill(process, mode: SandboxMode, uid: int | None) -> None:
    """SIGKILL the run's process group (in a PID namespace its init, which takes every process with it);
    under an own uid without namespaces, also every process of that uid (``setsid`` ones included)."""
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if uid is not None and not mode.namespaces:
        try:
            quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            subprocess.run(
                ["/bin/sh", "-c", "kill -9 -1"], user=uid, group=uid, extra_groups=[], cwd="/", timeout=10, **quiet
            )
        except (OSError, subprocess.SubprocessError) as error:
            logger.warning("Could not kill the processes of sandbox uid %d: %s", uid, error)
