"""Precision (which dtypes the operators really run in), EMA arithmetic, checkpoint prefixes and random
generator states, presets."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dynaforge.config import ConfigError, load_config, save_config
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.runs import load_checkpoint, save_checkpoint, strip_wrapper_prefixes
from dynaforge.train.checkpoint import restore_rng_state, rng_state
from dynaforge.train.ema import EMA
from dynaforge.train.losses import LOSSES
from dynaforge.train.precision import Precision, full_precision

pytestmark = pytest.mark.usefixtures("one_thread")


class OperatorDtypes(TorchDispatchMode):
    """Records (operator name, dtypes of its floating tensor inputs) for every aten call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, set[torch.dtype]]] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
        self.calls.append((func.overloadpacket.__name__, dtypes))
        return func(*args, **(kwargs or {}))

    def dtypes_of(self, *names: str) -> set[torch.dtype]:
        return {d for name, dtypes in self.calls if name in names for d in dtypes}


def tiny_fno(*overrides: str) -> torch.nn.Module:
    config = load_config(None, ["model.width=8", "model.modes=4", "model.layers=2", *overrides])
    return build_model(config.model, ModelShape(1, 2, 1))


@pytest.mark.parametrize("transform", ["fft", "dft"])
def test_bf16_autocast_runs_pointwise_layers_in_bf16_and_the_spectral_path_in_fp32(transform: str) -> None:
    model = tiny_fno(f"model.spectral_transform={transform}")
    frames = torch.randn(3, 2, 1, 16, dtype=torch.float32)
    precision = Precision("bf16", torch.device("cpu"))
    recorder = OperatorDtypes()
    with recorder, precision.autocast():
        output = model(ModelInput(frames=frames)).frames
    loss = LOSSES["mse"](output, torch.zeros_like(frames[:, :1]))
    # the pointwise (1x1) layers, channels-last matrix products
    assert recorder.dtypes_of("addmm", "mm") == {torch.bfloat16}
    if transform == "fft":
        assert recorder.dtypes_of("_fft_r2c", "_fft_c2r") == {torch.float32}
    else:
        assert not recorder.dtypes_of("_fft_r2c", "_fft_c2r")
    # the spectral mode mixing (and the DFT matrix products), autocast off
    assert recorder.dtypes_of("bmm") == {torch.float32}
    assert loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_spectral_low_precision_lets_autocast_run_the_dft_products_in_bf16() -> None:
    model = tiny_fno("model.spectral_transform=dft", "model.spectral_low_precision=true")
    recorder = OperatorDtypes()
    with recorder, Precision("bf16", torch.device("cpu")).autocast():
        model(ModelInput(frames=torch.randn(3, 2, 1, 16, dtype=torch.float32)))
    assert recorder.dtypes_of("bmm") == {torch.bfloat16}


def test_fp32_runs_nothing_in_low_precision() -> None:
    model = tiny_fno()
    frames = torch.randn(2, 2, 1, 16, dtype=torch.float32)
    model(ModelInput(frames=frames))  # builds (in float64) and caches the DFT matrices, in float32
    recorder = OperatorDtypes()
    with recorder, Precision("fp32", torch.device("cpu")).autocast():
        model(ModelInput(frames=frames))
    all_dtypes = {d for _, dtypes in recorder.calls for d in dtypes}
    assert all_dtypes == {torch.float32}


def test_full_precision_switches_autocast_off() -> None:
    a = torch.randn(4, 4, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        with full_precision("cpu"):
            assert (a @ a).dtype == torch.float32


def test_fp16_on_cpu_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"fp16 needs a CUDA device.*use train\.precision=bf16"):
        Precision("fp16", torch.device("cpu"))
    assert not Precision("bf16", torch.device("cpu")).scaling


def test_ema_follows_its_formula() -> None:
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, decay=0.9, warmup=False)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.fill_(1.0)
    for _ in range(3):
        ema.update(model)
    torch.testing.assert_close(ema.module.weight, 0.9**3 * start + (1 - 0.9**3) * torch.ones_like(start))
    assert not ema.module.training and not ema.module.weight.requires_grad


def test_ema_warmup_decay() -> None:
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = EMA(model, decay=0.99, warmup=True)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)  # decay min(0.99, 1/10) = 0.1
    assert ema.module.weight.item() == pytest.approx(0.9)
    ema.update(model)  # decay 2/11
    assert ema.module.weight.item() == pytest.approx(1 - 0.1 * 2 / 11)
    state = ema.state_dict()
    fresh = EMA(torch.nn.Linear(1, 1, bias=False), decay=0.99)
    fresh.load_state_dict(state)
    assert fresh.updates.item() == 2 and fresh.module.weight.item() == ema.module.weight.item()


def test_checkpoints_load_state_dicts_written_with_wrapper_prefixes(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    compiled_and_ddp = {f"_orig_mod.module.{k}": v for k, v in model.state_dict().items()}
    save_checkpoint(tmp_path / "c.pt", {"format_version": 1, "model": compiled_and_ddp})
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert set(loaded["model"]) == {"weight", "bias"}
    torch.nn.Linear(2, 2).load_state_dict(loaded["model"])
    assert strip_wrapper_prefixes({"module._orig_mod.a.module.b": 1}) == {"a.module.b": 1}


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's state
    save_checkpoint(tmp_path / "r.pt", {"format_version": 1, "rng": [rng_state()]})
    expected = (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist())
    restore_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"][0])
    assert (random.random(), np.random.standard_normal(3).tolist(), torch.rand(3).tolist()) == expected


def test_train_presets_fill_in_beneath_explicit_values(tmp_path: Path) -> None:
    fast = load_config(None, ["train.preset=fast"]).train
    assert (
        fast.precision == "bf16"
        and fast.compile.enabled
        and fast.cuda_graph.enabled
        and fast.log_every == 100
    )
    debug = load_config(None, ["train.preset=debug"]).train
    assert debug.deterministic and debug.log_every == 1 and debug.max_bad_steps == 1
    assert load_config(None, []).train.precision == "fp32"
    mine = load_config(
        None, ["train.preset=fast", "train.precision=fp32", "train.compile.mode=max-autotune"]
    ).train
    assert mine.precision == "fp32" and mine.compile.enabled and mine.compile.mode == "max-autotune"
    path = tmp_path / "preset.yaml"
    path.write_text("train:\n  preset: fast\n  compile: {enabled: false}\n")
    from_file = load_config(path).train
    assert from_file.precision == "bf16" and not from_file.compile.enabled
    with pytest.raises(
        ConfigError, match=re.escape("train.preset='turbo' is not valid; choose one of: debug, default, fast")
    ):
        load_config(None, ["train.preset=turbo"])
    # A saved (fully resolved) config reloads to itself, whatever the preset would fill in.
    save_config(
        mine_config := load_config(None, ["train.preset=fast", "train.precision=fp32"]), tmp_path / "s.yaml"
    )
    assert load_config(tmp_path / "s.yaml") == mine_config
