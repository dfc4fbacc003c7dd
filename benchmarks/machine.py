"""What every benchmark records about the machine it ran on, so that a record says whether it was shared."""

from __future__ import annotations

import os


def load_note() -> str:
    """The load averages when called, against the core count: near the benchmark's thread count on a quiet
    machine; well above it, other jobs shared the cores and the timings are provisional."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f}/{five:.1f}/{fifteen:.1f} (1/5/15 min) on {os.cpu_count()} cores"
