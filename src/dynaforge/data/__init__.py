"""Datasets of training windows from a store folder, normalisation statistics, loaders."""

from dynaforge.data.identity import (
    DataIdentity,
    check_config_matches_data,
    check_same_data,
    data_fingerprint,
    data_identity,
    mixture_members,
)
from dynaforge.data.loader import make_loader, safe_start_method
from dynaforge.data.normalize import Normalizer
from dynaforge.data.windows import (
    MemoryTrajectories,
    Window,
    WindowDataset,
    window_starts,
)

__all__ = [
    "DataIdentity",
    "MemoryTrajectories",
    "Normalizer",
    "Window",
    "WindowDataset",
    "check_config_matches_data",
    "check_same_data",
    "data_fingerprint",
    "data_identity",
    "make_loader",
    "mixture_members",
    "safe_start_method",
    "window_starts",
]
