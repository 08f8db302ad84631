"""The code sandbox against adversarial programs: each must score 0 (or be contained), never 1 by a trick."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from diversed_hf.tasks import rewards
from diversed_hf.tasks.sandbox import OUTPUT_TAIL_BYTES, sandbox_mode

MODE = sandbox_mode()
needs_pid_namespace = pytest.mark.skipif(not MODE.pid_namespace, reason="no PID namespace on this machine")
needs_own_uid = pytest.mark.skipif(not MODE.own_uid, reason="the sandbox has no uid of its own here (not root)")
needs_net_namespace = pytest.mark.skipif(not MODE.network_namespace, reason="no network namespace on this machine")

FAILING_TEST = "assert add(2, 3) == 5"
WRONG_ADD = "def add(a, b):\n    return a - b\n"


def score(code: str, tests: str = FAILING_TEST, timeout: float = 10.0) -> float:
    return rewards.pass_at_1([code], [tests], timeout=timeout)[0]


def test_a_correct_program_passes_even_if_it_silences_print():
    assert score("import builtins\nbuiltins.print = lambda *a, **k: None\ndef add(a, b):\n    return a + b\n") == 1.0


@pytest.mark.parametrize(
    "exit_trick",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "raise SystemExit(0)\n",
        "import atexit, os\natexit.register(lambda: os._exit(0))\n",
        "import sys\nsys.excepthook = lambda *args: None\n",
        "import os\nos.close(1)\n",
    ],
)
def test_exiting_or_hiding_the_failure_scores_zero(exit_trick):
    assert score(exit_trick + WRONG_ADD) == 0.0


def test_overriding_assertion_error_does_not_make_tests_pass():
    code = "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n" + WRONG_ADD
    assert score(code) == 0.0


def test_endless_loop_and_sleep_hit_the_wall_clock_limit():
    for program in ("while True:\n    pass", "import time\ntime.sleep(100)"):
        start = time.monotonic()
        passed, reason = rewards.run_program(program, timeout=1.5)
        assert (passed, reason) == (False, "timeout")
        assert time.monotonic() - start < 10


def test_endless_output_is_drained_into_a_bounded_tail():
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)"
    passed, reason = rewards.run_program(program, timeout=1.5)
    assert (passed, reason) == (False, "timeout")
    # A long but finite stream: the run still passes, only the tail is kept.
    program = "import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 4096)\n"
    assert rewards.run_program(program, timeout=20) == (True, "passed")
    assert OUTPUT_TAIL_BYTES <= 64 * 1024


def test_memory_limit():
    passed, reason = rewards.run_program("x = bytearray(1024 * 1024 * 1024)", timeout=10, memory_mb=256)
    assert not passed and "MemoryError" in reason


@needs_own_uid
def test_fork_bomb_is_bounded_and_cleaned_up():
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    passed, reason = rewards.run_program(program, timeout=2)
    assert not passed
    time.sleep(0.5)
    assert not _processes_with("while True:\\n    try:\\n        os.fork()")


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


@needs_pid_namespace
def test_detached_children_do_not_outlive_the_run():
    marker = f"diversed-sandbox-orphan-{os.getpid()}-{time.time_ns()}"
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


@needs_own_uid
def test_writes_outside_the_work_directory_are_refused(tmp_path):
    tmp_path.chmod(0o755)
    target = tmp_path / "owned-by-the-caller.txt"
    program = f"open({str(target)!r}, 'w').write('pwned')"
    passed, reason = rewards.run_program(program, timeout=10)
    assert not passed and "PermissionError" in reason
    assert not target.exists()
    assert rewards.run_program("import os\nopen(os.path.join(os.environ['HOME'], 'ok.txt'), 'w').write('fine')")[0]


def test_the_callers_environment_is_out_of_reach(monkeypatch):
    monkeypatch.setenv("DIVERSED_SANDBOX_SECRET", "hf_secret_token_value")
    program = (
        "import os, glob\n"
        "assert 'DIVERSED_SANDBOX_SECRET' not in os.environ\n"
        "leaks = []\n"
        "for path in glob.glob('/proc/[0-9]*/environ'):\n"
        "    try:\n"
        "        if b'hf_secret_token_value' in open(path, 'rb').read():\n"
        "            leaks.append(path)\n"
        "    except OSError:\n"
        "        pass\n"
        "assert not leaks, leaks\n"
    )
    if not (MODE.pid_namespace or MODE.own_uid):
        pytest.skip("neither a PID namespace nor an own uid here: /proc shows the caller (the README says so)")
    assert rewards.run_program(program, timeout=10) == (True, "passed")


def test_signals_to_the_caller_are_refused():
    program = f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)"
    passed, _ = rewards.run_program(program, timeout=10)
    assert not passed  # and this test process is still alive to check it


def test_socket_module_is_blocked():
    program = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"
    passed, reason = rewards.run_program(program, timeout=10)
    assert not passed and ("PermissionError" in reason or "network" in reason)
    assert rewards.sandbox_network_mode() in ("netns+audit", "audit")


@needs_net_namespace
def test_ctypes_sockets_cannot_reach_a_listening_port():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    program = (
        "import ctypes, struct, socket\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(2, 1, 0)\n"
        "assert fd >= 0, 'socket() failed'\n"
        f"address = struct.pack('!HH4s8x', 2, {port}, bytes([127, 0, 0, 1]))\n"
        "address = struct.pack('=H', 2) + address[2:]\n"
        "assert libc.connect(fd, address, len(address)) == 0, 'connect() failed'\n"
    )
    try:
        passed, reason = rewards.run_program(program, timeout=10)
    finally:
        server.close()
    assert not passed, reason


def test_pass_at_1_still_scores_honest_programs():
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0"
    completions = ["def add(a, b):\n    return a + b\n[DONE]", WRONG_ADD, "def add(a, b) return"]
    assert rewards.pass_at_1(completions, [tests] * 3, timeout=10) == [1.0, 0.0, 0.0]
