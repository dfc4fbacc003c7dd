"""Which machine made a result: CPU model and the vector extensions that change its arithmetic or speed,
library versions and the device. Recorded beside every dataset (manifest and shard records) and every
benchmark figure, so that a reader knows whether two results can be compared byte for byte."""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

import dynaforge

EXTENSIONS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)
"""CPU flags worth naming: which code paths torch, MKL and oneDNN can take (AMX: bf16 matrix units)."""


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return set()
    for line in info.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else the platform's processor string)."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model"):
                return value.strip()
    return platform.processor() or platform.machine()


def cpu_extensions() -> list[str]:
    """The flags of `EXTENSIONS` this CPU has, in that order."""
    flags = cpu_flags()
    return [name for name in EXTENSIONS if name in flags]


def has_bf16_matrix_units(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 matrix products and convolutions run on matrix units that make them several times
    faster than float32: AMX on a CPU (`amx_bf16`), tensor cores on a CUDA device of compute capability 8 or
    later. AVX-512 bf16 alone (`avx512_bf16`, e.g. AMD EPYC or Xeons before AMX) only doubles the vector dot
    product rate, which the conversions and float32 accumulation eat up (docs/random_cnn.md)."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.get_device_capability(index)[0] >= 8
    return "amx_bf16" in cpu_flags()


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"{device} ({torch.cuda.get_device_name(index)})"
    return str(device)


def indexed_device(device: torch.device) -> torch.device:
    """`cuda` named by its index (`cuda:0` for the current GPU); any other device as given.
    `torch.cuda.set_device` refuses a CUDA device without an index, and `tensor.device == device` is
    False for `cuda:0` against `cuda`."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def local_rank_device(name: str) -> str:
    """`auto`/`cuda` mean this process's own GPU, `cuda:LOCAL_RANK`, when a launcher (torchrun) set
    LOCAL_RANK and CUDA is available: otherwise every process of a node would work on cuda:0. Any other
    name (`cpu`, `cuda:1`), and every name outside such a launcher, is returned as given."""
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and name in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(local_rank)}"
    return name


def machine_record(device: torch.device | str = "cpu") -> dict[str, Any]:
    """CPU, extensions, core count, versions and device: what decides whether results match bit for bit."""
    return {
        "cpu": cpu_model(),
        "cpu_extensions": cpu_extensions(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "dynaforge": dynaforge.__version__,
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "numpy": np.__version__,
        "h5py": package_version("h5py"),
        "device": device_name(device),
    }


def package_version(name: str) -> str | None:
    """The installed version of distribution `name` (None when it is not installed), read from its metadata
    without importing it (h5py belongs to the store; this module only names its version)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_summary(record: dict[str, Any]) -> str:
    """One line: 'Intel(R) Xeon(R) Processor (avx512_bf16, amx_bf16), torch 2.13.0+cpu, cpu'."""
    notable = [e for e in record.get("cpu_extensions", []) if e.startswith(("amx", "avx512_bf16", "sve"))]
    extensions = f" ({', '.join(notable)})" if notable else ""
    return (
        f"{record.get('cpu', '?')}{extensions}, torch {record.get('torch', '?')}, {record.get('device', '?')}"
    )
