"""The checksum an exported model carries, so that a file changed after `dynaforge export` is not used.

`dynaforge export` writes, next to the `dynaforge` metadata (JSON), a `dynaforge_sha256` entry: the hex
SHA-256 of that metadata string followed by every initializer of the graph in name order, each as its name,
its ONNX data type, its dims and its values as little-endian bytes (the values, not their protobuf
encoding, so the digest does not depend on how the tensor's fields were written). `dynaforge rollout`
recomputes it before running the model (`onnx_rollout.checked_model`).

Imports numpy and nothing of PyTorch: the torch-free rollout uses it. `onnx` is imported lazily by the
caller that parses the file (an optional extra, dynaforge[export]).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

METADATA_KEY = "dynaforge"
"""metadata_props key of the JSON metadata written by `dynaforge export`."""
CHECKSUM_KEY = "dynaforge_sha256"
"""metadata_props key of the checksum of the metadata and the weights."""


def model_checksum(model: onnx.ModelProto, metadata: str) -> str:
    """Hex SHA-256 of `metadata` (the `dynaforge` JSON) and the initializers of `model` (see module doc)."""
    from onnx import numpy_helper  # lazy: an optional extra (dynaforge[export]); callers have loaded onnx

    digest = hashlib.sha256()
    digest.update(metadata.encode())
    for tensor in sorted(model.graph.initializer, key=lambda t: t.name):
        values = np.ascontiguousarray(numpy_helper.to_array(tensor))
        header = f"\n{tensor.name}\n{tensor.data_type}\n{list(tensor.dims)}\n"
        digest.update(header.encode())
        digest.update(values.astype(values.dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()
