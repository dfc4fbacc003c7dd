"""The dataset format: spec and errors (format.py), writer (sharded, atomic, resumable), reader, validator,
and the readers of PDEBench and The Well files (interop)."""

from dynaforge.store.format import DatasetError, SplitArrays
from dynaforge.store.reader import DatasetFolder, TrajectoryReader
from dynaforge.store.validate import validate_dataset

__all__ = ["DatasetError", "DatasetFolder", "SplitArrays", "TrajectoryReader", "validate_dataset"]
