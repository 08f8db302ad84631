"""Stage 2 of a sandboxed run: run the program and its tests, and report success on a private channel.

Not imported by the package: ``sandbox_setup`` execs ``python -I -B -c <this file's text> <fd>`` once
the process is contained. The harness

1. reads all of stdin: a per-run random nonce on the first line, then the program (UTF-8), so
   nothing is left for the program to read there;
2. makes the result descriptor ``<fd>`` close-on-exec and keeps the nonce in its own frame only: an
   ``exec`` of a new interpreter (``python3 -O`` re-running the file, a rewritten copy) loses both;
3. installs an audit hook refusing Python sockets (PEP 578; it cannot be removed);
4. compiles the program with ``optimize=0`` (its ``assert`` statements are kept whatever the flags)
   and runs it as ``__main__`` in this process;
5. writes the nonce to ``<fd>`` only when the program and its tests ran to their end without an
   exception (``SystemExit`` included); otherwise prints the traceback and exits 1 without running
   ``atexit`` handlers.

The caller scores a pass when it reads the nonce on its end of ``<fd>`` and the process exits 0, so
the verdict depends neither on what the program prints nor on the interpreter's flags. See
docs/sandbox.md for what this does not cover.
"""

import os
import sys


def _no_network(event, args):
    if event.startswith("socket.") and event != "socket.sethostname":
        raise PermissionError("network access is disabled in the diversed_hf sandbox")


def _run() -> None:
    import builtins
    import traceback
    import types

    result_fd = int(sys.argv[1])
    os.set_inheritable(result_fd, False)
    data = sys.stdin.buffer.read()
    nonce, _, source = data.partition(b"\n")
    del data
    write, exit_now, print_exception = os.write, os._exit, traceback.print_exception
    if sys.flags.optimize:  # started without -O and with -I (no PYTHONOPTIMIZE): this cannot happen
        write(2, b"the diversed_hf sandbox refuses to run with -O: asserts would be skipped\n")
        exit_now(1)
    sys.addaudithook(_no_network)
    path = os.path.join(os.getcwd(), "program.py")
    try:  # for tracebacks, __file__ and inspect; the program runs from `source`, not from this copy
        with open(path, "wb") as handle:
            handle.write(source)
    except OSError:
        pass
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.argv = [path]
    sys.path.insert(0, os.getcwd())
    try:
        code = compile(source.decode("utf-8", "replace"), path, "exec", dont_inherit=True, optimize=0)
        del source
        exec(code, module.__dict__)
    except BaseException as error:  # noqa: BLE001 - SystemExit too: exiting early is not passing
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        try:
            if isinstance(error, SystemExit):
                write(2, f"SystemExit({error.code!r}) before the end of the tests\n".encode(errors="replace"))
            else:
                print_exception(type(error), error, error.__traceback__, file=sys.__stderr__)
                sys.__stderr__.flush()
        except BaseException:  # noqa: BLE001
            write(2, f"{type(error).__name__}\n".encode(errors="replace"))
        exit_now(1)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    write(result_fd, nonce + b"\n")


if __name__ == "__main__":
    _run()
