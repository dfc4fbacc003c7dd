"""What a path named as an ONNX model holds, told without PyTorch: nothing, a folder, a file that is not
ONNX at all, a damaged ONNX file, an ONNX model written by someone else, or a `dynaforge export`.

`dynaforge rollout` uses it to say which of these a bad `--onnx` is, and `dynaforge export` to decide
whether `--out` may be replaced: a dynaforge export is recognised by the `dynaforge` metadata entry
(`checksum.METADATA_KEY`) that every export carries, whatever its checksum says; anything else is kept
unless the user passes `--force`.

"Not ONNX" is told from "damaged" by the first bytes: onnx writes a model's fields in field-number order,
so an ONNX file starts with field 1, `ir_version` (byte 0x08, then a one-byte varint). A truncated ONNX
file keeps that start; a PyTorch checkpoint (a zip archive), an HDF5 file or a text file never has it.
"""

from __future__ import annotations

import codecs
import enum
from pathlib import Path
from typing import Any, NamedTuple

from dynaforge.export.checksum import METADATA_KEY

HEAD_BYTES = 512
"""How much of a file is read to tell what it is before reading all of it."""
SIGNATURES = {
    b"PK\x03\x04": "a zip archive, as PyTorch checkpoints (.pt) are",
    b"\x89HDF": "an HDF5 file",
    b"\x80": "a Python pickle",
}
"""Starts of files often passed by mistake, and how a message names them."""


class Holds(enum.Enum):
    """What a path holds, as a message names it."""

    NOTHING = "missing"
    FOLDER = "a folder"
    NOT_ONNX = "not an ONNX file"
    DAMAGED = "a damaged ONNX file"
    FOREIGN = "an ONNX model not written by `dynaforge export`"
    EXPORT = "a model written by `dynaforge export`"


class OnnxFile(NamedTuple):
    holds: Holds
    detail: str
    """Why, for a message: what the bytes look like or why they do not parse ('' when nothing to add)."""
    content: bytes
    """The whole file when it was parsed (the bytes a caller should use), else b''."""
    proto: Any
    """The parsed onnx.ModelProto, or None."""
    properties: dict[str, str]
    """The model's metadata_props."""


def read_onnx_file(path: Path) -> OnnxFile:
    """Read `path` once (only its start when that already says it is not ONNX) and say what it holds."""
    import onnx  # lazy: an optional extra (dynaforge[export])
    from google.protobuf.message import DecodeError  # lazy: comes with onnx

    if path.is_dir():
        return OnnxFile(Holds.FOLDER, "", b"", None, {})
    if not path.exists():
        return OnnxFile(Holds.NOTHING, "", b"", None, {})
    with path.open("rb") as handle:
        head = handle.read(HEAD_BYTES)
    if not head:
        return OnnxFile(Holds.DAMAGED, "an empty file", b"", None, {})
    if not starts_like_onnx(head):
        if not head.strip(b"\0"):
            return OnnxFile(Holds.DAMAGED, "its bytes are zeros", b"", None, {})
        return OnnxFile(Holds.NOT_ONNX, looks_like(head), b"", None, {})
    content = path.read_bytes()
    try:
        proto = onnx.load_from_string(content)
    except DecodeError as error:
        return OnnxFile(Holds.DAMAGED, f"not a readable ONNX protobuf: {error}", content, None, {})
    if not proto.HasField("graph"):
        return OnnxFile(Holds.DAMAGED, "no model graph in it", content, proto, {})
    properties = {entry.key: entry.value for entry in proto.metadata_props}
    holds = Holds.EXPORT if METADATA_KEY in properties else Holds.FOREIGN
    return OnnxFile(holds, "", content, proto, properties)


def starts_like_onnx(head: bytes) -> bool:
    """True when `head` begins as onnx writes a model: field 1 (ir_version, a varint) with a one-byte value."""
    return len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= 0x7F


def looks_like(head: bytes) -> str:
    """What the start of a file that is not ONNX looks like, for a message ('' when it says nothing)."""
    for signature, name in SIGNATURES.items():
        if head.startswith(signature):
            return name
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at the end is fine
    except UnicodeDecodeError:
        return ""
    return "a text file"


def run_of(path: Path) -> Path | None:
    """The run folder `path` is, or whose checkpoints/ holds `path`; None for anything else."""
    run = path.parent.parent if path.parent.name == "checkpoints" else path
    return run if (run / "checkpoints").is_dir() else None
