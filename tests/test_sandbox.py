"""The code sandbox against adversarial programs: each must score 0 (or be contained), never 1 by a trick.

What each mode enforces is in docs/sandbox.md; the tests below check it mode by mode. Modes run in
this process when it has the privileges that pick them (root: ``namespaces``, ``own-uid``; otherwise
``user-namespace``, ``plain``). When this process is root, the unprivileged modes run the way they
run in practice: from a caller under an unprivileged uid (``UNPRIVILEGED_UID``), started here, which
is also the process a program tries to kill. A mode this machine cannot give is skipped with the
reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

import pytest

from diversed_hf.lab.tasks import rewards, sandbox
from diversed_hf.lab.tasks.sandbox import MAX_PROCESSES, OUTPUT_TAIL_BYTES, sandbox_mode

MODE = sandbox_mode()
ROOT = os.geteuid() == 0
UNPRIVILEGED_UID = 60500  # the caller of the unprivileged modes when this process is root; outside the sandbox's pool
TASKS_DIR = Path(sandbox.__file__).resolve().parent
needs_pid_namespace = pytest.mark.skipif(not MODE.pid_namespace, reason="no PID namespace on this machine")
needs_own_uid = pytest.mark.skipif(not MODE.own_uid, reason="the sandbox has no uid of its own here (not root)")

FAILING_TEST = "assert add(2, 3) == 5"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
RIGHT_ADD = "def add(a, b):\n    return a + b\n"


def score(code: str, tests: str = FAILING_TEST, timeout: float = 10.0) -> float:
    return rewards.pass_at_1([code], [tests], timeout=timeout)[0]


# ------------------------------------------------------------------------------------------------
# Running a program in a given mode


@lru_cache(maxsize=None)
def _python_for(uid: int) -> str | None:
    """An interpreter ``uid`` can run with its standard library (the venv's may sit under a private home)."""
    for python in dict.fromkeys([sys.executable, shutil.which("python3"), "/usr/bin/python3"]):
        if python and os.path.exists(python):
            try:
                done = subprocess.run(
                    [python, "-I", "-c", "import ctypes, json, selectors"],
                    user=uid,
                    group=uid,
                    extra_groups=[],
                    cwd="/",
                    capture_output=True,
                    timeout=30,
                )
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0:
                return python
    return None


SECRET = "hf_secret_token_value"  # in the initial environment of a process next to the run: /proc shows it

_HELPER = """
import dataclasses, importlib, json, sys, tempfile, types
package = types.ModuleType("sandbox_pkg")
package.__path__ = [sys.argv[1]]
sys.modules["sandbox_pkg"] = package
sandbox = importlib.import_module("sandbox_pkg.sandbox")
mode = sandbox._working_mode(sys.argv[2])
full = mode is not None and mode == sandbox._candidate(sys.argv[2])  # not one that works only without its layers
print(json.dumps(None if full else repr(mode)), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    tempfile.tempdir = request["tmpdir"]
    forced = dataclasses.replace(mode, **request["changes"])
    print(json.dumps([sandbox.run_program(p, mode=forced, **request["kwargs"]) for p in request["programs"]]), flush=True)
"""
_HELPERS: dict = {}  # mode name -> (the unprivileged caller's process, why the mode is unavailable or None)


def _helper(name: str) -> subprocess.Popen:
    """The unprivileged caller running ``name``'s mode (started once, and again if a program killed it)."""
    process, unavailable = _HELPERS.get(name, (None, None))
    if process is None or process.poll() is not None:
        python = _python_for(UNPRIVILEGED_UID)
        if python is None:
            pytest.skip(f"no Python interpreter that uid {UNPRIVILEGED_UID} may run")
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "DIVERSED_SANDBOX_SECRET": SECRET}
        process = subprocess.Popen(
            [python, "-I", "-c", _HELPER, str(TASKS_DIR), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            user=UNPRIVILEGED_UID,
            group=UNPRIVILEGED_UID,
            extra_groups=[],
            cwd="/",
            env=env,
        )
        unavailable = json.loads(process.stdout.readline() or '"the unprivileged caller did not start"')
        _HELPERS[name] = (process, unavailable)
    if unavailable is not None:
        pytest.skip(f"uid {UNPRIVILEGED_UID} cannot get the full {name} sandbox mode here: {unavailable}")
    return process


@pytest.fixture(scope="module", autouse=True)
def _stop_helpers():
    yield
    for process, _ in _HELPERS.values():
        process.stdin.close()
        process.wait(timeout=60)


@dataclasses.dataclass(frozen=True)
class ModeRunner:
    """Runs programs in one mode: here, or from an unprivileged caller when this process is root."""

    name: str
    changes: tuple = ()  # SandboxMode fields to override, e.g. (("landlock", 0),)

    @property
    def label(self) -> str:
        return self.name + "".join(f"-{k}={v}" for k, v in self.changes)

    def mode(self) -> sandbox.SandboxMode | None:
        mode = sandbox.available_modes().get(self.name)
        if mode is None and self.name == "own-uid" and ROOT:  # the venv's interpreter may be private to root
            python = _python_for(61000)
            if python:
                candidate = dataclasses.replace(sandbox._candidate("own-uid"), python=python)
                mode = candidate if sandbox.run_program("pass", mode=candidate)[0] else None
        return mode and dataclasses.replace(mode, **dict(self.changes))

    @property
    def via_helper(self) -> bool:
        return ROOT and self.name in ("user-namespace", "plain")

    def run(self, programs: list[str], tmpdir: str | None = None, **kwargs) -> list[tuple[bool, str]]:
        if not self.via_helper:
            if not ROOT and self.name in ("namespaces", "own-uid"):
                pytest.skip(f"the {self.name} mode needs root")
            mode = self.mode()
            if mode is None:
                pytest.skip(f"this machine cannot give the {self.name} sandbox mode")
            saved, tempfile.tempdir = tempfile.tempdir, tmpdir or tempfile.tempdir
            try:
                return [sandbox.run_program(p, mode=mode, **kwargs) for p in programs]
            finally:
                tempfile.tempdir = saved
        process = _helper(self.name)
        request = {"changes": dict(self.changes), "kwargs": kwargs, "programs": programs, "tmpdir": tmpdir}
        try:
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            answer = process.stdout.readline()
        except BrokenPipeError:
            answer = ""
        assert answer, f"the unprivileged caller died (status {process.poll()})"
        return [tuple(result) for result in json.loads(answer)]


BASE_MODES = [ModeRunner(name) for name in sandbox.MODE_NAMES]
NO_LANDLOCK = [ModeRunner("own-uid", (("landlock", 0),)), ModeRunner("plain", (("landlock", 0),))]


def modes(*runners):
    return pytest.mark.parametrize("runner", runners, ids=lambda runner: runner.label)


@pytest.fixture
def shared_tmp():
    """A directory every uid may traverse, used as the sandboxes' tempfile.tempdir (their work directories)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None  # RAM: deep trees are slow on some disks
    path = tempfile.mkdtemp(prefix="diversed-sandbox-test-", dir=base)
    os.chmod(path, 0o755)
    if ROOT:
        os.chown(path, UNPRIVILEGED_UID, UNPRIVILEGED_UID)  # the unprivileged caller makes its work directories here
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _marker() -> str:
    return f"diversed-sandbox-{os.getpid()}-{time.time_ns()}"


# ------------------------------------------------------------------------------------------------
# The verdict


def test_a_correct_program_passes_even_if_it_silences_print():
    assert score("import builtins\nbuiltins.print = lambda *a, **k: None\n" + RIGHT_ADD) == 1.0


@pytest.mark.parametrize(
    "exit_trick",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "raise SystemExit(0)\n",
        "import atexit, os\natexit.register(lambda: os._exit(0))\n",
        "import sys\nsys.excepthook = lambda *args: None\n",
        "import os\nos.close(1)\n",
        "import os\nos.close(2)\n",
        "import os, sys\nos.write(1, sys.stdin.buffer.read())\nos._exit(0)\n",  # stdin held the sentinel
        "import os, sys\ndata = sys.stdin.buffer.read()\nfor fd in range(1, 64):\n    try:\n        os.write(fd, data)\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
    ],
)
def test_exiting_or_hiding_the_failure_scores_zero(exit_trick):
    assert score(exit_trick + WRONG_ADD) == 0.0


def test_overriding_assertion_error_does_not_make_tests_pass():
    code = "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n" + WRONG_ADD
    assert score(code) == 0.0


REEXEC_TRICKS = {
    # asserts stripped by -O in a new interpreter running the same file (it used to score 1.0)
    "python -O": "import os, sys\nif not sys.flags.optimize:\n    os.execv(sys.executable, [sys.executable, '-O'] + sys.argv)\n",
    "PYTHONOPTIMIZE": (
        "import os, sys\nif not sys.flags.optimize:\n"
        "    os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONOPTIMIZE='2'))\n"
    ),
    # a new interpreter on a copy of the file without its tests
    "rewritten copy": (
        "import os, sys\nif 'copy' not in sys.argv[0]:\n"
        "    text = open(sys.argv[0]).read().replace('assert ', 'pass  # ')\n"
        "    open('copy.py', 'w').write(text)\n"
        "    os.execv(sys.executable, [sys.executable, 'copy.py'])\n"
    ),
}


@modes(*BASE_MODES)
def test_rerunning_itself_without_its_asserts_scores_zero(runner):
    programs = [trick + WRONG_ADD + FAILING_TEST for trick in REEXEC_TRICKS.values()]
    # control: running another interpreter (not replacing this one) is fine
    subprocess_run = "import subprocess, sys\nsubprocess.run([sys.executable, '-O', '-c', 'pass'], check=True)\n"
    programs.append(subprocess_run + RIGHT_ADD + FAILING_TEST)
    results = runner.run(programs)
    assert [passed for passed, _ in results] == [False] * len(REEXEC_TRICKS) + [True], results


def test_output_after_the_tests_does_not_change_the_verdict():
    chatty = [
        "import atexit\natexit.register(lambda: print('x' * 100_000))\n",
        "import sys, threading\nthreading.Thread(target=lambda: sys.stdout.write('y' * 100_000)).start()\n",
        "import atexit, sys\natexit.register(lambda: sys.stderr.write('z' * 100_000))\n",
    ]
    assert rewards.pass_at_1([c + RIGHT_ADD for c in chatty], [FAILING_TEST] * 3) == [1.0, 1.0, 1.0]
    assert rewards.pass_at_1([c + WRONG_ADD for c in chatty], [FAILING_TEST] * 3) == [0.0, 0.0, 0.0]


def test_lone_surrogates_in_a_completion_score_normally():
    right = "def add(a, b):\n    return a + b  # \ud800\n"
    wrong = "def add(a, b):\n    s = '\udcff'\n    return a - b\n"
    assert rewards.pass_at_1([right, wrong], [FAILING_TEST] * 2) == [1.0, 0.0]


def test_endless_loop_and_sleep_hit_the_wall_clock_limit():
    for program in ("while True:\n    pass", "import time\ntime.sleep(100)"):
        assert rewards.run_program(program, timeout=1.5) == (False, "timeout")


def test_endless_output_is_drained_into_a_bounded_tail():
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)"
    assert rewards.run_program(program, timeout=1.5) == (False, "timeout")
    # A long but finite stream: the run still passes, only the tail is kept.
    program = "import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 4096)\n"
    assert rewards.run_program(program, timeout=20) == (True, "passed")
    assert OUTPUT_TAIL_BYTES <= 64 * 1024


def test_memory_limit():
    passed, reason = rewards.run_program("x = bytearray(1024 * 1024 * 1024)", timeout=10, memory_mb=256)
    assert not passed and "MemoryError" in reason


def test_run_program_checks_its_arguments():
    with pytest.raises(TypeError, match="`source` must be a str"):
        rewards.run_program(b"pass")
    with pytest.raises(ValueError, match="`timeout`"):
        rewards.run_program("pass", timeout=0)
    with pytest.raises(TypeError, match="`mode`"):
        rewards.run_program("pass", mode="plain")
    with pytest.raises(ValueError, match=r"`timeout` must be seconds in \(0, 86400\]"):  # was OverflowError
        rewards.run_program("pass", timeout=float("inf"))
    with pytest.raises(ValueError, match=r"`memory_mb` must be an integer in \[64, 16777216\]"):  # failed at setup
        rewards.run_program("pass", memory_mb=2**45)
    assert rewards.run_program("pass", memory_mb=1 << 24, timeout=30) == (True, "passed")


def test_pass_at_1_still_scores_honest_programs():
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
    completions = [RIGHT_ADD + "[DONE]", WRONG_ADD, "def add(a, b) return"]
    assert rewards.pass_at_1(completions, [tests] * 3, timeout=10) == [1.0, 0.0, 0.0]


def test_modes_are_described():
    assert MODE.name in sandbox.MODE_NAMES and MODE.name in MODE.describe()
    assert list(sandbox.available_modes())[0] == MODE.name
    assert rewards.sandbox_network_mode() in ("netns+audit", "audit")


# ------------------------------------------------------------------------------------------------
# Files: nothing outlives the run, the temporary space is limited in total, cleanup never raises


@modes(*BASE_MODES, NO_LANDLOCK[0])
def test_files_in_shared_temporary_directories_do_not_outlive_the_run(runner, shared_tmp):
    marker, key = _marker(), 0x5EED0000 + os.getpid() % 0xFFFF
    program = (
        "import ctypes, os, tempfile\n"
        f"for directory in ('/tmp', '/var/tmp', '/dev/shm', '/run/lock', tempfile.gettempdir()):\n"
        "    try:\n"
        f"        open(os.path.join(directory, {marker!r}), 'w').write('left behind')\n"
        "    except OSError:\n"
        "        pass\n"
        f"ctypes.CDLL(None).shmget({key}, 1 << 20, 0o1600)  # a System V segment: RAM until removed\n"
        + RIGHT_ADD
        + FAILING_TEST
    )
    before = set(os.listdir(shared_tmp))
    assert runner.run([program], tmpdir=shared_tmp) == [(True, "passed")]
    left = [d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.exists(os.path.join(d, marker))]
    assert not left, f"{runner.label} left {marker} in {left}"
    assert set(os.listdir(shared_tmp)) == before
    segments = Path("/proc/sysvipc/shm").read_text().split("\n")[1:] if os.path.exists("/proc/sysvipc/shm") else []
    assert not [line for line in segments if line.split() and int(line.split()[0]) == key]


@modes(*BASE_MODES)
def test_temporary_space_is_limited_in_total(runner):
    if runner.name in ("own-uid", "plain"):
        pytest.skip("without a mount namespace only the size of each file is limited (docs/sandbox.md)")
    program = "import os\nfor i in range(6):\n    open(f'/tmp/big{i}', 'wb').write(b'x' * (15 << 20))\n"
    [(passed, reason)] = runner.run([program])
    assert not passed and "No space left on device" in reason, reason


TAMPERING = {
    "symlink": "import os, shutil\nhere = os.getcwd()\nos.chdir('/')\nshutil.rmtree(here)\nos.symlink({victim!r}, here)\n",
    "moved": "import os\nhere = os.getcwd()\nos.rename(here, here + '-moved')\nos.mkdir(here)\n",
    "deep tree": "import os\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').write('x')\n",
    "unreadable": "import os\nos.makedirs('a/b/c')\nos.chmod('a/b', 0)\nos.chmod('a', 0)\n",
}


@modes(*BASE_MODES, *NO_LANDLOCK)
def test_tampering_with_the_work_directory_never_raises_and_leaves_nothing(runner, shared_tmp, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("the caller's file")
    tricks = [t.format(victim=str(victim)) for t in TAMPERING.values()]
    programs = [t + WRONG_ADD + FAILING_TEST for t in tricks] + [t + RIGHT_ADD + FAILING_TEST for t in tricks[:2]]
    results = runner.run(programs, tmpdir=shared_tmp)
    assert [p for p, _ in results[: len(tricks)]] == [False] * len(tricks), results
    # inside the private /tmp replacing it is harmless (scored on the tests); on this machine's /tmp it scores 0
    assert [p for p, _ in results[len(tricks) :]] == [runner.name in ("namespaces", "user-namespace")] * 2, results
    assert os.listdir(shared_tmp) == []
    assert (victim / "keep.txt").read_text() == "the caller's file"


def test_removing_a_deep_and_unreadable_tree(shared_tmp):
    from diversed_hf.lab.tasks.sandbox_files import remove_workdir

    top = os.path.join(shared_tmp, "work")
    os.mkdir(top)
    (Path(top) / "link").symlink_to(shared_tmp)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1500):  # deeper than the recursion limit and than PATH_MAX
        os.mkdir("d", dir_fd=fd)
        os.mkdir("private", 0, dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    assert remove_workdir(top, fd) is True
    assert os.listdir(shared_tmp) == []


@modes(ModeRunner("namespaces"), ModeRunner("user-namespace"))
def test_an_interpreter_under_tmp_runs_behind_the_private_tmp_read_only(runner):
    base = _python_for(UNPRIVILEGED_UID) if ROOT else sys.executable
    if base is None:
        pytest.skip(f"no Python interpreter that uid {UNPRIVILEGED_UID} may run")
    home = tempfile.mkdtemp(prefix="diversed-sandbox-venv-")
    try:
        os.chmod(home, 0o755)
        subprocess.run([base, "-m", "venv", "--without-pip", os.path.join(home, "venv")], check=True, timeout=120)
        if ROOT:
            subprocess.run(["chown", "-R", f"{UNPRIVILEGED_UID}:{UNPRIVILEGED_UID}", home], check=True)
        program = (
            "import os, sys\nassert sys.prefix.startswith('/tmp/'), sys.prefix\n"
            "open(os.path.join(sys.prefix, 'written-by-the-program'), 'w')\n"
        )
        runner = dataclasses.replace(runner, changes=(("python", os.path.join(home, "venv", "bin", "python")),))
        [(passed, reason)] = runner.run([program])
        assert not passed and ("Read-only file system" in reason or "PermissionError" in reason), reason
        assert not os.path.exists(os.path.join(home, "venv", "written-by-the-program"))
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# Processes: a process limit in every mode, the caller survives, nothing is left running


@modes(*BASE_MODES)
def test_forked_children_are_bounded(runner):
    program = (
        "import os, time\nchildren = 0\n"
        "for _ in range(40):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "            os._exit(0)\n"
        "    except OSError:\n"
        "        break\n"
        "    children += 1\n"
        "raise SystemExit(f'forked {children}')\n"
    )
    if runner.name in ("user-namespace", "plain") and ROOT and not runner.via_helper:
        pytest.skip("RLIMIT_NPROC does not apply to uid 0")
    [(passed, reason)] = runner.run([program], timeout=20)
    forked = int(reason.split("forked ")[1].split("'")[0])
    assert forked < MAX_PROCESSES, f"{forked} children: memory in all could reach {forked + 1} x memory_mb"


KILL_THE_CALLER = [
    "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\n",
    "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    "import os, signal\nfor pid in {caller}:\n    os.kill(pid, signal.SIGTERM)\n",
    "import ctypes, os\nctypes.CDLL(None).syscall(62, os.getppid(), 9)\n",  # the raw kill(2) of x86_64
]


@modes(*BASE_MODES, NO_LANDLOCK[1])
def test_the_caller_survives_a_program_that_signals_it(runner):
    if runner.name == "plain" and ROOT and not runner.via_helper:
        pytest.skip("never tried as root outside namespaces")
    if (
        runner.name == "plain"
        and not runner.via_helper
        and (mode := runner.mode())
        and not (mode.landlock >= 6 or mode.seccomp)
    ):
        pytest.skip(
            "plain mode without Landlock's signal scope or seccomp does not protect the caller (docs/sandbox.md)"
        )
    caller = "[os.getppid()]" if runner.via_helper else f"[{os.getpid()}, os.getppid()]"
    programs = [p.format(caller=caller) + WRONG_ADD + FAILING_TEST for p in KILL_THE_CALLER]
    results = runner.run(programs)  # the caller (this process, or the unprivileged one) answers: it survived
    assert not any(passed for passed, _ in results), results
    # Own children may still be signalled, except where seccomp alone guards the caller (plain without
    # Landlock's signal scope): there a program may signal only itself and its process group.
    [(passed, reason)] = runner.run(
        ["import subprocess\nsubprocess.Popen(['sleep', '30']).kill()\n" + RIGHT_ADD + FAILING_TEST]
    )
    assert passed == (runner.label != "plain-landlock=0"), reason


@needs_pid_namespace
def test_detached_children_do_not_outlive_the_run():
    marker = _marker()
    sleeper = f"['/bin/sh', '-c', 'sleep 60; echo', '{marker}']"
    program = (
        "import os, subprocess\n"
        f"subprocess.Popen({sleeper}, start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid()\n"
        f"    os.execv('/bin/sh', {sleeper})\n"
    )
    assert rewards.run_program(program, timeout=10)[0]
    time.sleep(0.5)
    assert _processes_with(marker) == []


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode("utf-8", "replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# ------------------------------------------------------------------------------------------------
# What the program can reach: the caller's files and environment, sockets


@needs_own_uid
def test_writes_outside_the_work_directory_are_refused(tmp_path):
    tmp_path.chmod(0o755)
    target = tmp_path / "owned-by-the-caller.txt"
    passed, reason = rewards.run_program(f"open({str(target)!r}, 'w').write('pwned')", timeout=10)
    assert not passed and ("PermissionError" in reason or "FileNotFoundError" in reason), reason
    assert not target.exists()
    assert rewards.run_program("import os\nopen(os.path.join(os.environ['HOME'], 'ok.txt'), 'w').write('fine')")[0]


@modes(*BASE_MODES)
def test_the_callers_environment_is_out_of_reach(runner):
    program = (
        "import os, glob\n"
        "assert 'DIVERSED_SANDBOX_SECRET' not in os.environ\n"
        "leaks = []\n"
        "for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        f"        if {SECRET.encode()!r} in open(path, 'rb').read():\n"
        "            leaks.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "assert not leaks, leaks\n"
    )
    # The unprivileged caller has the secret in its environment; here, a process next to the run has it.
    neighbour = subprocess.Popen(["sleep", "60"], env={"DIVERSED_SANDBOX_SECRET": SECRET})
    try:
        assert runner.run([program]) == [(True, "passed")]
    finally:
        neighbour.kill()
        neighbour.wait()


@pytest.fixture
def listeners(tmp_path):
    """A unix socket at a path every uid may reach, and one in the abstract namespace; both listening."""
    tmp_path.chmod(0o755)
    path = str(tmp_path / "host.sock")
    servers = []
    for address in (path, "\0" + _marker()):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(4)
        server.setblocking(False)
        servers.append((server, address))
    os.chmod(path, 0o777)
    yield servers
    for server, _ in servers:
        server.close()


@modes(*BASE_MODES)
def test_unix_sockets_of_the_host_are_out_of_reach(runner, listeners):
    addresses = [address.encode() for _, address in listeners]
    program = (
        "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nconnected = []\n"
        "if libc.socket(1, 1, 0) < 0:\n    raise SystemExit('socket() refused')\n"
        f"for address in {addresses!r}:\n"
        "    fd = libc.socket(1, 1, 0)\n"
        "    raw = struct.pack('H', 1) + address\n"
        "    if libc.connect(fd, raw, len(raw)) == 0:\n        connected.append(address)\n"
        "raise SystemExit(f'connected to {connected}')\n"
    )
    [(passed, reason)] = runner.run([program])
    assert not passed and "socket() refused" in reason, reason
    for server, address in listeners:
        with pytest.raises(BlockingIOError):
            server.accept()


def test_socket_module_is_blocked():
    program = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"
    passed, reason = rewards.run_program(program, timeout=10)
    assert not passed and ("PermissionError" in reason or "network" in reason)


@modes(*BASE_MODES)
def test_ctypes_sockets_cannot_reach_a_listening_port(runner):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    program = (
        "import ctypes, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\n"
        "assert fd >= 0, 'socket() failed'\n"
        f"address = struct.pack('=H', 2) + struct.pack('!H4s8x', {port}, bytes([127, 0, 0, 1]))\n"
        "assert libc.connect(fd, address, len(address)) == 0, 'connect() failed'\n"
    )
    try:
        [(passed, reason)] = runner.run([program])
        assert not passed, reason
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


HOLD_MEMFD = """
import os
fds = []
for i in range(40):
    fd = os.memfd_create(f"m{i}")
    for _ in range(15):
        os.write(fd, b"x" * (1 << 20))
    fds.append(fd)
assert sum(os.fstat(fd).st_size for fd in fds) >= 600 << 20
"""
HOLD_SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for i in range(40):
    segment = libc.shmget(0, 16 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    assert segment >= 0, f"shmget refused: errno {ctypes.get_errno()}"
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(address))  # detached: no longer in the address space, still in RAM
"""


@modes(*BASE_MODES)
@pytest.mark.parametrize("program", [HOLD_MEMFD, HOLD_SYSV], ids=["memfd", "sysv-shm"])
def test_memory_outside_the_address_space_is_refused(runner, program):
    """memfd files written and not mapped, and detached System V segments (in the namespace modes), let a program
    hold 600+ MiB under memory_mb=64 and pass; seccomp now refuses both in every mode."""
    if runner.mode() is not None and not runner.mode().seccomp:
        pytest.skip("without seccomp these are not bounded (docs/sandbox.md)")
    [(passed, reason)] = runner.run([program], memory_mb=64, timeout=20)
    assert not passed and ("PermissionError" in reason or "errno 1" in reason), reason
