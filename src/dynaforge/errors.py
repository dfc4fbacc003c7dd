"""Errors that name the fix, shared by modules that must not import PyTorch (the ONNX rollout, the CLI's
argument handling). `ConfigError` lives with the config (`dynaforge.config`), `DatasetError` with the store's
format (`dynaforge.store.format`)."""

from __future__ import annotations


class RunError(RuntimeError):
    """A run folder that cannot be used as asked; the message says why and what to do."""
