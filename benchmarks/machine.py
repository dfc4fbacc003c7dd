"""What every benchmark records about the machine it ran on: which CPU (and whether it has AMX, the bf16
matrix units that decide bf16 convolution speed), and whether other jobs shared it."""

from __future__ import annotations

import os

import torch

from dynaforge.machine import cpu_extensions, cpu_model


def machine_name() -> str:
    """'Intel(R) Xeon(R) Processor, AVX-512 with AMX (bf16 matrix units), 2 cores': the row label of the
    README's figures."""
    extensions = set(cpu_extensions())
    if "amx_bf16" in extensions:
        vector = "AVX-512 with AMX (bf16 matrix units)"
    elif "avx512_bf16" in extensions:
        vector = "AVX-512 with bf16, no AMX"
    elif "avx512f" in extensions:
        vector = "AVX-512, no bf16"
    elif "avx2" in extensions:
        vector = "AVX2"
    else:
        vector = ", ".join(sorted(extensions)) or "no vector extensions listed"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_model()}, {vector}, {cores} cores"


def load_note(machine: str | None = None) -> str:
    """The machine (`machine_name()` unless given: a script that holds itself to fewer cores names the
    machine before) and the load averages when called, against the core count: near the benchmark's thread
    count on a quiet machine; well above it, other jobs shared the cores and the timings are provisional."""
    one, five, fifteen = os.getloadavg()
    return (
        f"{machine or machine_name()}; load average {one:.1f}/{five:.1f}/{fifteen:.1f} (1/5/15 min) "
        f"on {os.cpu_count()} cores"
    )


def device_name(device: object) -> str:
    """'NVIDIA H200 (CUDA 13.0, torch 2.11.0+cu130)' for a CUDA device, else machine_name()."""
    device = torch.device(device)
    if device.type != "cuda":
        return machine_name()
    return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
