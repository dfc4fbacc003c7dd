"""Writes that lose nothing: atomic files and the one rule for a verb's output folder.

An atomic file is written to a temporary file in the same folder, flushed to disk, then renamed: a reader
(or a killed writer's successor) sees either the old file or the complete new one, never a partial file
under the final name. An output folder is checked by `check_output_folder` before anything is written into it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dynaforge.errors import OUT, DynaforgeError

TMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on failure remove it."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=TMP_SUFFIX, dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp makes 0600; give the file the usual permissions
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_output_folder(
    root: str | os.PathLike[str], writes: Sequence[str], what: str, error: type[DynaforgeError]
) -> None:
    """The one rule for the folder a verb writes (its `out`): it may be missing, empty, or hold only the
    entries the verb itself writes there, its own earlier output, which the verb then resumes or checks
    against its config. Anything else in it is refused with `error` before anything is written, so that
    nothing of the user's is mixed with the verb's output or overwritten.

    `writes`: the names (glob patterns) of what the verb writes at the top of the folder; `what`: the folder
    it makes, for the message ("a dataset folder"). Hidden entries (a killed writer's temporaries, locks,
    .DS_Store) are not counted.
    """
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise error(
            f"{root} is a file, not {what}; choose an empty or new {OUT} folder (nothing was written)"
        )
    if not root.is_dir():
        return
    foreign = sorted(
        entry.name
        for entry in root.iterdir()
        if not entry.name.startswith(".") and not any(fnmatch.fnmatch(entry.name, p) for p in writes)
    )
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise error(
            f"{root} is not empty and is not {what}: it holds {shown}. Nothing was written; choose an empty "
            f"or new {OUT} folder, or move what it holds elsewhere"
        )


def remove_stale_temporaries(folder: str | os.PathLike[str], name: str = "*") -> list[Path]:
    """Delete the temporaries of file `name` (default: any) left in `folder` by a killed writer.

    Temporaries are never read; only call this for files no other live process is writing.
    """
    removed = []
    if not Path(folder).is_dir():
        return removed
    for tmp in Path(folder).glob(f".{name}.*{TMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    # Directory fsync makes the rename itself durable; not every platform allows opening a directory.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
