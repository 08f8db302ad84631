"""Removing what a sandboxed program left on this machine's disk, whatever it did to it.

Used by :mod:`diversed_hf.lab.tasks.sandbox` in the modes without a mount namespace (docs/sandbox.md).
Every operation goes through directory descriptors opened with ``O_NOFOLLOW``: a symlink is removed,
never followed, so nothing outside the tree is touched even when the program swapped a directory for
a link. The walk is iterative and keeps at most ``MAX_OPEN_DEPTH`` directories open; deeper ones are
moved up to the top first, so a tree of any depth is removed. Nothing here raises: failures are
logged and reported as ``False``.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat

logger = logging.getLogger(__name__)

MAX_OPEN_DEPTH = 32
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # writable by every uid: where an own uid leaves files
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name: str, parent_fd: int) -> int:
    """Open the directory ``name`` of ``parent_fd`` without following a symlink; make it readable if it is not."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:  # a program may chmod 000 its directories; the owner (or root) can undo that
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # the directory itself, whatever its name points to now
        finally:
            os.close(path_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def clear_directory(top_fd: int) -> None:
    """Remove everything inside the directory open at ``top_fd`` (raises ``OSError`` when something stays)."""
    stack: list[tuple[int, str]] = []  # (descriptor, name in the directory below it) of directories being emptied
    try:
        while True:
            fd = stack[-1][0] if stack else top_fd
            child = None
            with os.scandir(fd) as entries:
                for entry in entries:
                    if not entry.is_dir(follow_symlinks=False):
                        os.unlink(entry.name, dir_fd=fd)
                    elif len(stack) >= MAX_OPEN_DEPTH:  # flatten: move the subtree up, it is emptied from there
                        os.rename(entry.name, f".flattened-{secrets.token_hex(8)}", src_dir_fd=fd, dst_dir_fd=top_fd)
                    else:
                        child = entry.name
                        break
            if child is not None:
                stack.append((_open_dir(child, fd), child))
                continue
            if not stack:
                return
            fd, name = stack.pop()
            os.close(fd)
            os.rmdir(name, dir_fd=stack[-1][0] if stack else top_fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _remove_entry(parent_fd: int, name: str) -> None:
    """Remove ``name`` from the directory ``parent_fd``: unlink a file or symlink, empty and remove a directory."""
    if not stat.S_ISDIR(os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    fd = _open_dir(name, parent_fd)
    try:
        clear_directory(fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def remove_workdir(path: str, fd: int) -> bool:
    """Remove the work directory created at ``path`` and open at ``fd`` (closed here); never raises.

    True when it was still there, as created, and is gone. False when the program replaced or moved it
    (what it put at ``path`` is removed, and the directory itself wherever it now is) or when something
    could not be removed (logged).
    """
    intact = True
    parent_fd = None
    try:
        try:
            clear_directory(fd)
        except OSError as error:
            logger.warning("Could not empty the sandbox directory %s: %s", path, error)
            intact = False
        created = os.fstat(fd)
        parent_fd = os.open(os.path.dirname(path), _DIR_FLAGS)
        name = os.path.basename(path)
        try:
            found = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            found = None
        if found is not None and (found.st_dev, found.st_ino) == (created.st_dev, created.st_ino):
            os.rmdir(name, dir_fd=parent_fd)
            return intact
        logger.warning("A sandboxed program replaced or moved its work directory %s; removing what is left.", path)
        if found is not None:
            _remove_entry(parent_fd, name)
        moved = os.readlink(f"/proc/self/fd/{fd}")  # where the directory is now, if it still exists
        if moved.startswith("/") and not moved.endswith(" (deleted)"):
            now = os.stat(moved, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (created.st_dev, created.st_ino):
                os.rmdir(moved)
        return False
    except Exception as error:  # noqa: BLE001 - cleanup must never raise into the caller
        logger.warning("Could not remove the sandbox directory %s: %s", path, error)
        return False
    finally:
        os.close(fd)
        if parent_fd is not None:
            os.close(parent_fd)


def sweep_uid(uid: int) -> None:
    """Remove every top-level entry of the shared temporary directories owned by ``uid`` (a sandbox's own uid)."""
    for directory in TEMP_DIRS:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                names = [e.name for e in entries if e.stat(follow_symlinks=False).st_uid == uid]
            for name in names:
                _remove_entry(fd, name)
        except Exception as error:  # noqa: BLE001 - cleanup must never raise into the caller
            logger.warning("Could not remove the files sandbox uid %d left in %s: %s", uid, directory, error)
        finally:
            os.close(fd)
