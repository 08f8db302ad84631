"""Run untrusted generated code (MBPP-style pass@1) in a separate, contained process.

What a program run by :func:`run_program` gets, on Linux:

============================ ==================================================================
passes only when             it prints a per-run random sentinel that the harness writes **after the
                             last test line**: exiting early (``sys.exit(0)``, ``os._exit(0)``, an
                             ``atexit`` exit) or swallowing the tests' failure by exiting scores 0
time                         a wall-clock limit (``timeout``) on the whole process tree, plus a CPU limit
output                       stdout and stderr are drained continuously; only the last 8 KiB of each is
                             kept, so an endless stream costs no memory
process tree                 its own session and process group, killed as a whole at exit and at
                             timeout; in a PID namespace (when available) every process it started,
                             ``setsid`` ones included, dies with it; ``RLIMIT_NPROC`` when it runs under
                             its own uid
files                        a fresh temporary directory as cwd, ``HOME`` and ``TMPDIR``; when this
                             process is root the program runs as its own unprivileged uid, so it cannot
                             write where the caller can, nor read root-only files
environment                  a minimal one (``PATH``, ``LANG``, ``HOME``, ``TMPDIR``); the caller's
                             environment (tokens) is out of reach through ``/proc`` in a PID namespace
                             or under a separate uid
network                      an empty network namespace when available; in every mode an audit hook,
                             installed first, refuses socket creation, connection and name lookup
limits                       address space (``memory_mb``), file size 16 MiB, 64 open files, no core dump
============================ ==================================================================

:func:`sandbox_mode` says which protections this machine gives: ``unshare`` with root (PID, network
and mount namespaces, own uid) is the full set; an unprivileged user namespace gives the namespaces
without the own uid; with neither, the program runs with the caller's uid, can read its environment
through ``/proc`` and reach the network through anything the audit hook does not see (``ctypes``), and
a warning says so at first use.

**What it is not.** A guard against accidents and shortcuts of generated code, not a security boundary
against code written to escape: a program can read its own source or stdin (and so the sentinel),
exhaust CPU and memory up to the limits, and use kernel interfaces the namespaces do not cover. Run
hostile code in a container or a VM.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from dataclasses import dataclass

logger = logging.getLogger(__name__)

__all__ = ["SandboxMode", "run_program", "sandbox_mode", "sandbox_network_mode"]

OUTPUT_TAIL_BYTES = 8 * 1024
MAX_PROCESSES = 32  # RLIMIT_NPROC under the sandbox's own uid
FILE_SIZE_LIMIT = 16 * 1024 * 1024
_UIDS = itertools.cycle(range(61000, 61256))  # one uid per concurrent run: RLIMIT_NPROC counts per uid
_UID_LOCK = threading.Lock()

# Installed first in every sandboxed program; audit hooks cannot be removed once added (PEP 578).
_NETWORK_GUARD = textwrap.dedent(
    """
    import sys as _sys
    def _diversed_no_network(event, args):
        if event.startswith("socket.") and event != "socket.sethostname":
            raise PermissionError("network access is disabled in the diversed_hf sandbox")
    _sys.addaudithook(_diversed_no_network)
    del _sys, _diversed_no_network
    """
)
# Appended after the program and its tests: echo the sentinel read from stdin, bypassing `print`.
_SENTINEL_ECHO = textwrap.dedent(
    """
    import os as _diversed_os, sys as _diversed_sys
    for _diversed_stream in (_diversed_sys.stdout, _diversed_sys.stderr):
        try:
            _diversed_stream.flush()
        except Exception:
            pass
    _diversed_os.write(1, b"\\n" + _diversed_sys.stdin.buffer.readline())
    """
)


@dataclass(frozen=True)
class SandboxMode:
    """Which protections :func:`run_program` has on this machine."""

    pid_namespace: bool
    network_namespace: bool
    own_uid: bool
    prefix: tuple[str, ...]  # command prefix that enters the namespaces (``{uid}`` filled per run)

    def describe(self) -> str:
        parts = [name for name, on in (("pid-ns", self.pid_namespace), ("net-ns", self.network_namespace),
                                       ("own-uid", self.own_uid)) if on]  # fmt: skip
        return "+".join(parts + ["audit"])


def _probe(prefix: list[str]) -> bool:
    command = [part.format(uid=61000) for part in prefix] + [sys.executable, "-I", "-c", "pass"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.lru_cache(maxsize=None)
def sandbox_mode() -> SandboxMode:
    """The strongest containment this machine supports (probed once per process)."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    if sys.platform.startswith("linux") and unshare:
        namespaces = [unshare, "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
        candidates = []
        if os.geteuid() == 0 and setpriv:
            own_uid = [setpriv, "--reuid={uid}", "--regid={uid}", "--clear-groups", "--inh-caps=-all"]
            candidates.append(SandboxMode(True, True, True, tuple(namespaces + own_uid)))
        candidates.append(SandboxMode(True, True, False, tuple([unshare, "--user", "--map-root-user"] + namespaces[1:])))
        candidates.append(SandboxMode(False, True, False, (unshare, "--user", "--map-root-user", "--net")))
        candidates.append(SandboxMode(False, True, False, (unshare, "--net")))
        for mode in candidates:
            if _probe(list(mode.prefix)):
                return mode
    return SandboxMode(False, False, False, ())


def sandbox_network_mode() -> str:
    """``"netns+audit"`` when programs get an empty network namespace, else ``"audit"`` (the hook alone)."""
    return "netns+audit" if sandbox_mode().network_namespace else "audit"


@functools.lru_cache(maxsize=None)
def _warn_once(description: str) -> None:
    logger.warning(
        "The code sandbox runs with %s only: without a PID namespace and its own uid, a program can read this "
        "process's environment through /proc and leave processes behind; without a network namespace, code that "
        "bypasses Python's audit hooks (ctypes) can reach the network. Run untrusted code in a container.",
        description,
    )


def _limits(memory_mb: int, cpu_seconds: int, max_processes: int | None):
    def apply() -> None:  # runs in the child between fork and exec, inherited by everything it starts
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if max_processes is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))

    return apply


def _drain(stream, keep: bytearray) -> None:
    """Read ``stream`` to its end, keeping only its last ``OUTPUT_TAIL_BYTES`` in ``keep``."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        keep.extend(chunk)
        if len(keep) > OUTPUT_TAIL_BYTES:
            del keep[: len(keep) - OUTPUT_TAIL_BYTES]
    stream.close()


def _kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the run's process group (and with it the PID namespace's init, which takes the rest)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> tuple[bool, str]:
    """Run ``source`` in the sandbox; ``(passed, reason)``.

    ``passed`` means the program ran to its end (the sentinel written after its last line appeared
    on stdout) and exited with status 0 within ``timeout`` wall-clock seconds. ``reason`` is
    ``"passed"``, ``"timeout"``, ``"exited before the end"`` or the last line of the program's stderr.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"`timeout` must be positive seconds, got {timeout!r}.")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 64:
        raise ValueError(f"`memory_mb` must be an integer of at least 64 (the interpreter needs it), got {memory_mb!r}.")
    mode = sandbox_mode()
    if not (mode.pid_namespace and (mode.own_uid or mode.network_namespace)):
        _warn_once(mode.describe())
    with _UID_LOCK:
        uid = next(_UIDS)
    sentinel = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="diversed_sandbox_") as workdir:
        path = os.path.join(workdir, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(_NETWORK_GUARD + "\n" + source + "\n" + _SENTINEL_ECHO)
        if mode.own_uid:
            os.chown(workdir, uid, uid)
            os.chown(path, uid, uid)
        command = [part.format(uid=uid) for part in mode.prefix] + [sys.executable, "-I", "-B", path]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_limits(memory_mb, max(1, int(timeout) + 1), MAX_PROCESSES if mode.own_uid else None),
        )
        stdout, stderr = bytearray(), bytearray()
        readers = [threading.Thread(target=_drain, args=(s, b), daemon=True) for s, b in ((process.stdout, stdout), (process.stderr, stderr))]
        for reader in readers:
            reader.start()
        try:
            process.stdin.write(sentinel.encode() + b"\n")
            process.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_tree(process)  # at exit too: nothing the program started outlives the run
        process.wait()
        for reader in readers:
            reader.join(timeout=5)
    if timed_out:
        return False, "timeout"
    finished = sentinel.encode() in stdout
    if process.returncode == 0 and finished:
        return True, "passed"
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    if lines:
        return False, lines[-1]
    return False, "exited before the end" if process.returncode == 0 else f"exit status {process.returncode}"
