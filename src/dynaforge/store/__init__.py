"""The dataset format: writer (sharded, atomic, resumable), reader, validator."""

from dynaforge.store.reader import DatasetFolder, SplitArrays
from dynaforge.store.validate import validate_dataset
from dynaforge.store.writer import DatasetError, generate

__all__ = ["DatasetError", "DatasetFolder", "SplitArrays", "generate", "validate_dataset"]
