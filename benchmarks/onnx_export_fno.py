"""Can a 1D FNO be exported to ONNX? neuraloperator's and dynaforge's, with both PyTorch exporters.

Issue 9 states that neuraloperator's FNO cannot be exported with either exporter because of its complex
arithmetic. This script tries, and records what happens: the same FNO size as benchmarks/train_fno.py
(width 32, 16 Fourier modes, 4 layers, projection 64, one input and one output channel, N = 128), exported
with `torch.onnx.export(..., dynamo=False)` (the TorchScript-based exporter) and `dynamo=True` (the
torch.export-based one), each
- as a user would call it: the model in eval mode, parameters requiring grad;
- under `torch.no_grad()` with every parameter frozen (`requires_grad=False`).
For neuraloperator's legacy export the script also retries with its `state_dict` override bypassed (the
override adds a `_metadata` dict that the TorchScript tracer cannot detach), to show which failure comes next.
A model that exports is run in onnxruntime and compared with PyTorch on a random input.

Nothing here belongs to the package: dynaforge's own export command, `dynaforge export`, lives in
dynaforge.export and uses the dynamo exporter, as this benchmark found it must.

Run: `.venv-bench/bin/python benchmarks/onnx_export_fno.py [--quick]` (or `make bench`); `--quick`, the smoke run
(`make bench-smoke`), runs the same checks and writes to a temporary folder (smoke.quick_path).
Writes benchmarks/results/onnx_export_fno.json (`dynaforge` / `baseline_value`: max |onnxruntime - torch|
of the exported model, null when the export failed; no ratio).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import tempfile
import types
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from dynaforge.atomic import atomic_write_json
from dynaforge.config import FNOConfig
from dynaforge.models import ModelInput, ModelShape, build_model
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "onnx_export_fno.json"
WIDTH, MODES, LAYERS, PROJECTION, RESOLUTION = 32, 16, 4, 64, 128
EXPORTERS = {"legacy (dynamo=False)": False, "dynamo (dynamo=True)": True}


class FramesToFrames(nn.Module):
    """dynaforge's FNO with a plain tensor in and out (frames (B, 1, 1, N)), as an exporter wants it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, frames: Tensor) -> Tensor:
        return self.model(ModelInput(frames=frames)).frames


def dynaforge_fno() -> nn.Module:
    config = FNOConfig(width=WIDTH, modes=MODES, layers=LAYERS, projection=PROJECTION, residual=False)
    return FramesToFrames(build_model(config, ModelShape(channels=1, history=1, horizon=1, spatial_dims=1)))


def neuraloperator_fno() -> nn.Module:
    from neuralop.models import FNO

    return FNO(
        n_modes=(2 * MODES - 2,),  # keeps n // 2 + 1 = 16 rfft modes on the last axis
        in_channels=1,
        out_channels=1,
        hidden_channels=WIDTH,
        n_layers=LAYERS,
        lifting_channel_ratio=0,
        projection_channel_ratio=PROJECTION / WIDTH,
        positional_embedding=None,
        non_linearity=nn.functional.gelu,
        use_channel_mlp=False,
        fno_skip="linear",
    )


def without_metadata_state_dict(model: nn.Module) -> nn.Module:
    """neuraloperator's model with torch's own `state_dict` instead of its override (which adds `_metadata`)."""
    model.state_dict = types.MethodType(nn.Module.state_dict, model)  # type: ignore[method-assign]
    return model


@dataclass(frozen=True)
class Attempt:
    label: str
    exported: bool
    max_abs_diff: float | None
    message: str


@contextlib.contextmanager
def frozen(model: nn.Module, freeze: bool) -> Iterator[None]:
    """No grad and parameters not requiring grad, when `freeze`."""
    if not freeze:
        yield
        return
    flags = [p.requires_grad for p in model.parameters()]
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    try:
        with torch.no_grad():
            yield
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)


def try_export(label: str, model: nn.Module, example: Tensor, dynamo: bool, freeze: bool) -> Attempt:
    """Export, then run in onnxruntime and compare; any failure is caught and summarised."""
    import onnxruntime

    model.eval()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        try:
            with frozen(model, freeze), warnings.catch_warnings(), quiet_exporter():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (example,), str(path), dynamo=dynamo, input_names=["frames"])
        except Exception as error:
            return Attempt(label, False, None, summarise_error(error))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (output,) = session.run(None, {session.get_inputs()[0].name: example.numpy()})
    with torch.inference_mode():
        expected = model(example).numpy()
    difference = float(np.abs(output - expected).max())
    return Attempt(label, True, difference, f"exported; max |onnxruntime - torch| = {difference:.2e}")


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporters print progress and graph dumps; keep the benchmark's output to the results."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def summarise_error(error: BaseException) -> str:
    """The exception's type and its root cause in one line (the exporters' messages run to pages)."""
    text = str(error)
    causes = re.findall(r"<class '([^']+)'>: (.+)", text)
    if causes:
        kind, message = causes[0]
        return f"{type(error).__name__}, caused by {kind}: {message.strip()}"[:400]
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}"[:400]


def attempts_for(
    name: str, make: Callable[[], nn.Module], example: Tensor, dynamo: bool, extra: bool
) -> list[Attempt]:
    attempts = [
        try_export(f"{name}, eval mode", make(), example, dynamo, freeze=False),
        try_export(f"{name}, eval mode, frozen parameters, no_grad", make(), example, dynamo, freeze=True),
    ]
    if extra:
        attempts.append(
            try_export(
                f"{name}, eval mode, its state_dict override bypassed",
                without_metadata_state_dict(make()),
                example,
                dynamo,
                freeze=False,
            )
        )
    return attempts


def record(exporter: str, ours: list[Attempt], theirs: list[Attempt]) -> dict[str, Any]:
    def best(attempts: list[Attempt]) -> float | None:
        diffs = [a.max_abs_diff for a in attempts if a.max_abs_diff is not None]
        return min(diffs) if diffs else None

    notes = "; ".join(f"{a.label}: {a.message}" for a in theirs + ours)
    return {
        "case": (
            f"ONNX export of a 1D FNO (width {WIDTH}, {MODES} modes, {LAYERS} layers, N={RESOLUTION}), "
            f"torch.onnx.export {exporter}, torch {torch.__version__}"
        ),
        "baseline": f"neuraloperator {version('neuraloperator')} FNO",
        "metric": "max |onnxruntime - torch| of the exported model (null: export failed)",
        "dynaforge": best(ours),
        "baseline_value": best(theirs),
        "ratio": None,
        "notes": notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: the same checks, written to a temporary folder"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON records")
    args = parser.parse_args()
    torch.manual_seed(0)
    example = torch.randn(2, 1, RESOLUTION, dtype=torch.float32)
    records = []
    for exporter, dynamo in EXPORTERS.items():
        theirs = attempts_for("neuraloperator", neuraloperator_fno, example, dynamo, extra=not dynamo)
        ours = attempts_for("dynaforge", dynaforge_fno, example[:, None], dynamo, extra=False)
        print(f"\n{exporter}")
        for attempt in theirs + ours:
            print(f"  {attempt.label}: {attempt.message}")
        records.append(record(exporter, ours, theirs))
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    atomic_write_json(out, records)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
