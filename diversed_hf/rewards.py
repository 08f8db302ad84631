"""Sequence-level task rewards ``R(x)`` of SPEC §4/§7, as pure functions ``(completions, references) -> list[float]``.

=================== ======================================================================
``exact_match``     GSM8K: the final number (after the last ``####``, else the last number;
                    commas removed) of completion and reference are equal -> 1.0, else 0.0
``rouge2``          CNN/DailyMail, XSum: ROUGE-2 F1 in [0, 1] (``rouge_score``, no stemming)
``pass_at_1``       MBPP / HumanEval style: 1.0 iff the completion's code passes every test,
                    executed in a sandboxed **separate process** (see below)
=================== ======================================================================

The number extraction and ROUGE scorer are the testbed's (:mod:`diversed_hf.testbed.rewards`), so
the testbed's ``arith`` / ``summary`` rewards and GSM8K / XSum are scored by the same code.

Sandbox of :func:`pass_at_1` [decision]. Each program runs as ``python -I <file>`` in a fresh
``tempfile.TemporaryDirectory`` (its cwd, ``HOME`` and ``TMPDIR``), with an environment reduced
to ``PATH``/``LANG``, in its own session (the whole process group is killed on timeout), and with
``resource`` limits set in ``preexec_fn``: address space (``memory_mb``), CPU seconds, file size
(16 MiB), open files (64) and no core dumps. Network: when ``unshare -n`` works on this machine
(Linux, root or unprivileged user namespaces), the child runs in an empty network namespace; in
every case a ``sys.addaudithook`` prelude, which the program cannot remove, raises on any
``socket`` creation, connection or name lookup. :func:`sandbox_network_mode` says which applies.
This is a guard against accidents of generated code, not a security boundary against hostile
code: run untrusted code in a container.

``reward_for_task(task)`` wraps these in TRL's reward-function convention
``f(prompts=..., completions=..., **dataset_columns) -> list[float]`` reading the ``reference``
column that every loader of :mod:`diversed_hf.data` produces.
"""

from __future__ import annotations

import functools
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from .testbed.rewards import arith_reward, extract_final_number, rouge2_f1

__all__ = [
    "exact_match",
    "rouge2",
    "pass_at_1",
    "extract_code",
    "extract_final_number",
    "run_program",
    "sandbox_network_mode",
    "reward_for_task",
    "TASK_REWARDS",
]


def _check(completions: Sequence[str], references: Sequence, name: str = "references") -> None:
    if isinstance(completions, str) or isinstance(references, str):
        raise TypeError(f"`completions` and `{name}` must be lists, not a single string.")
    if len(completions) != len(references):
        raise ValueError(
            f"`completions` has {len(completions)} entries but `{name}` has {len(references)}; pass one per completion."
        )


def exact_match(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """GSM8K exact match: 1.0 where ``extract_final_number`` of completion and reference agree, else 0.0.

    A completion without any number scores 0; a reference without a number is an error (it cannot be matched).
    """
    _check(completions, references)
    return arith_reward(completions, references)


def rouge2(completions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-2 F1 in [0, 1] of each completion against its reference (report x 100 to compare with papers)."""
    _check(completions, references)
    return [rouge2_f1(c, r) for c, r in zip(completions, references)]


# ---------------------------------------------------------------------------------------------
# Code execution

_FENCE = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL)
_STOP_MARKERS = ("[DONE]", "\n[BEGIN]", "\nYou are an expert Python programmer")


def extract_code(completion: str) -> str:
    """The program in a completion: the first fenced block if any, else the text up to an MBPP stop marker."""
    fenced = _FENCE.search(completion)
    if fenced:
        return fenced.group(1)
    end = min((completion.find(m) for m in _STOP_MARKERS if m in completion), default=len(completion))
    return completion[:end]


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


@functools.lru_cache(maxsize=None)
def sandbox_network_mode() -> str:
    """``"netns+audit"`` when ``unshare -n`` works here (child gets no network interfaces), else ``"audit"``."""
    unshare = shutil.which("unshare")
    if unshare and sys.platform.startswith("linux"):
        try:
            done = subprocess.run([unshare, "-n", "true"], capture_output=True, timeout=10)
            if done.returncode == 0:
                return "netns+audit"
        except (OSError, subprocess.SubprocessError):
            pass
    return "audit"


def _limits(memory_mb: int, cpu_seconds: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_program(source: str, *, timeout: float = 10.0, memory_mb: int = 1024) -> tuple[bool, str]:
    """Run ``source`` in the sandbox; ``(passed, reason)`` where passed means exit status 0 within ``timeout``.

    ``reason`` is ``"passed"``, ``"timeout"`` or the last line of the program's stderr.
    """
    if timeout <= 0:
        raise ValueError(f"`timeout` must be positive seconds, got {timeout!r}.")
    if memory_mb < 64:
        raise ValueError(f"`memory_mb` must be at least 64 (the interpreter needs it), got {memory_mb!r}.")
    with tempfile.TemporaryDirectory(prefix="diversed_sandbox_") as workdir:
        path = os.path.join(workdir, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(_NETWORK_GUARD + "\n" + source + "\n")
        command = [sys.executable, "-I", "-B", path]
        if sandbox_network_mode() == "netns+audit":
            command = [shutil.which("unshare"), "-n", *command]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_limits(memory_mb, max(1, int(timeout) + 1)),
        )
        try:
            _, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.communicate()
            return False, "timeout"
        if process.returncode == 0:
            return True, "passed"
        lines = stderr.decode("utf-8", "replace").strip().splitlines()
        return False, lines[-1] if lines else f"exit status {process.returncode}"


def pass_at_1(
    completions: Sequence[str],
    tests: Sequence[str],
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    max_workers: int | None = None,
) -> list[float]:
    """1.0 where ``extract_code(completion) + "\\n" + tests`` exits cleanly in the sandbox within ``timeout`` s.

    ``tests`` holds one test program per completion (MBPP: setup code and the ``assert`` lines of
    ``test_list``; HumanEval: the ``check`` function and a call to it). Programs run in parallel
    separate processes (``max_workers``, default the CPU count), never in this process.
    """
    _check(completions, tests, "tests")
    programs = [extract_code(c) + "\n\n" + t for c, t in zip(completions, tests)]
    workers = max_workers or min(len(programs), os.cpu_count() or 1) or 1
    run = functools.partial(run_program, timeout=timeout, memory_mb=memory_mb)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(run, programs))
    return [float(passed) for passed, _ in results]


# ---------------------------------------------------------------------------------------------
# Task registry, in TRL's reward-function convention


def _testbed(name: str) -> Callable[[Sequence[str], Sequence[str]], list[float]]:
    def score(completions, references):
        from .testbed import reward

        return reward(name, completions, references)

    score.__name__ = f"testbed_{name}"
    return score


TASK_REWARDS: dict[str, Callable[[Sequence[str], Sequence[str]], list[float]]] = {
    "gsm8k": exact_match,
    "cnn_dailymail": rouge2,
    "xsum": rouge2,
    "mbpp": pass_at_1,
    "testbed_arith": _testbed("arith"),
    "testbed_summary": _testbed("summary"),
}


def reward_for_task(task: str) -> Callable[..., list[float]]:
    """TRL-style reward function ``f(prompts, completions, reference, **columns)`` of a task of :mod:`diversed_hf.data`."""
    if task not in TASK_REWARDS:
        raise ValueError(f"`task` is {task!r}; rewards exist for {sorted(TASK_REWARDS)}.")
    score = TASK_REWARDS[task]

    def reward(prompts=None, completions=None, reference=None, **columns) -> list[float]:
        if reference is None:
            raise ValueError(
                f"the {task!r} reward reads the dataset column 'reference', which the batch lacks; load the data with "
                "`diversed_hf.data.load_task_dataset` (it adds 'reference') or add the column yourself."
            )
        return score(list(completions), list(reference))

    reward.__name__ = task
    return reward
