"""The `train` section: the training engine's switches, and its presets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dynaforge.config.base import (
    AT_LEAST_ONE,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    at_least,
    between,
    check_values,
    checked,
)


@dataclass
class OptimizerConfig:
    """The optimiser. Weight decay (`train.weight_decay`) never touches biases and norm scales.

    - `adamw`, `adam`: fused kernels where the device has them (`fused: null`).
    - `sgd`: with `momentum` (and optionally Nesterov momentum).
    - `muon`: one optimiser object holding two: `torch.optim.Muon` for matrix-shaped weights (2D weights, and
      convolution kernels seen as (out, in x kernel) matrices), AdamW for everything else (biases, norms,
      embeddings, the FNO's spectral weights stored as real pairs unless `muon_spectral`, and parameters
      whose names match `muon_exclude`). See `dynaforge.train.optim`.
    """

    name: Literal["adamw", "adam", "sgd", "muon"] = "adamw"
    """Which optimiser."""
    betas: list[float] = field(
        default_factory=lambda: [0.9, 0.999],
        metadata={"check": between(0.0, 1.0, open_high=True).because("a moment decay rate")},
    )
    """Adam(W) moment decay rates, two numbers (also the AdamW half of `muon`)."""
    eps: float = checked(1e-8, check=POSITIVE)
    """Adam(W) denominator guard."""
    momentum: float = checked(0.9, check=FRACTION.because("momentum factor"))
    """`sgd`: momentum factor (0 disables momentum)."""
    nesterov: bool = False
    """`sgd`: Nesterov momentum."""
    fused: bool | None = None
    """Fused Adam/AdamW/SGD kernels; null means wherever the device supports them."""
    muon_lr: float | None = checked(None, check=POSITIVE.because("learning rate"))
    """`muon`: peak learning rate of the Muon half; null means `train.lr`."""
    muon_momentum: float = checked(0.95, check=FRACTION.because("momentum factor"))
    """`muon`: Muon's (Nesterov) momentum."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """`muon`: per-matrix lr scaling; `match_rms_adamw` (0.2 sqrt(max(A, B))) lets Muon reuse AdamW's lr."""
    muon_ns_steps: int = checked(5, check=AT_LEAST_ONE)
    """`muon`: Newton-Schulz iterations of the orthogonalisation."""
    muon_spectral: bool = False
    """`muon`: also give spectral weights (in, out, modes...) to Muon, as (in, out x modes) matrices."""
    muon_exclude: list[str] = field(default_factory=list)
    """`muon`: parameter-name patterns (fnmatch, e.g. `lift.*`) kept on AdamW even when matrix-shaped."""

    def __post_init__(self) -> None:
        check_values(self)
        if len(self.betas) != 2:
            raise ConfigError(f"betas needs two numbers, got {self.betas}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov needs momentum > 0")


@dataclass
class ScheduleConfig:
    """The learning-rate schedule: a linear warmup, then one of four shapes, as a multiple of the peak lr.

    Counted in `interval`s (optimiser steps or epochs). Warmup lasts `warmup_fraction` of all intervals.
    - `constant`: 1 after warmup.
    - `step`: multiplied by `gamma` every `step_size` intervals after warmup.
    - `cosine`: from 1 down to `min_lr_ratio` at the end of training.
    - `plateau`: multiplied by `factor` when the validation loss has not improved (by a relative
      `threshold`) for `patience` epochs; never below `min_lr_ratio`.
    """

    name: Literal["cosine", "constant", "step", "plateau"] = "cosine"
    """Shape after the warmup."""
    interval: Literal["step", "epoch"] = "step"
    """Advance the schedule once per optimiser step or once per epoch."""
    warmup_fraction: float = checked(
        0.0, check=between(0.0, 1.0, open_high=True).because("a share of training")
    )
    """Share of all intervals spent warming the lr up linearly from (nearly) zero. None by default: with
    the other defaults, no warmup beat 5 % on the three literature tasks (docs/literature.md, "Defaults")."""
    min_lr_ratio: float = checked(0.0, check=FRACTION.because("a fraction of the peak lr"))
    """`cosine`: final lr, `plateau`: floor, as a fraction of the peak lr."""
    step_size: int = checked(1, check=AT_LEAST_ONE)
    """`step`: intervals between decays."""
    gamma: float = checked(0.5, check=between(0.0, 1.0, open_low=True).because("decay factor"))
    """`step`: decay factor."""
    patience: int = checked(2, check=NON_NEGATIVE)
    """`plateau`: epochs without improvement before a decay."""
    factor: float = checked(0.5, check=between(0.0, 1.0, open_low=True).because("decay factor"))
    """`plateau`: decay factor."""
    threshold: float = checked(1e-4, check=NON_NEGATIVE)
    """`plateau`: an improvement must beat the best loss by this relative amount."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class CompileConfig:
    """`torch.compile` of the model; if compilation fails the run falls back to eager (logged)."""

    enabled: bool = False
    """Compile the model's forward (and its backward)."""
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile mode."""
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """torch.compile backend (`aot_eager` and `eager` are for debugging: no code generation)."""
    dynamic: bool | None = None
    """Dynamic shapes: null lets torch decide, false specialises on every new shape."""


@dataclass
class CudaGraphConfig:
    """Capture the whole training step (forward, backward, clip, optimiser, EMA) in a CUDA graph.

    CUDA only: after `warmup` eager steps on a side stream the step is captured once and replayed on
    static input buffers; batches of another shape (the last, partial one) run eagerly. Needs
    `optimizer.name` adam or adamw, `accumulate` 1, one process and fp32 or bf16; otherwise, or when
    capture fails, the run stays eager and says why in the log. Ignored on CPU.
    """

    enabled: bool = False
    """Capture the step on CUDA."""
    warmup: int = checked(3, check=AT_LEAST_ONE)
    """Eager steps before capture (lets lazy state such as optimiser moments be allocated)."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class EMAConfig:
    """An exponential moving average of the weights, updated after every optimiser step."""

    decay: float = checked(0.0, check=between(0.0, 1.0, open_high=True).because("weight of the old average"))
    """Weight of the old average per step (e.g. 0.999); 0 switches the EMA off."""
    warmup: bool = True
    """Use min(decay, (1 + n) / (10 + n)) at update n, so that early averages forget the initial weights."""
    evaluate: bool = True
    """Validate with the EMA weights and save them as the checkpoint's `model` (evaluation and best.pt)."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class WandbConfig:
    """Weights & Biases logging (the optional `wandb` extra: pip install 'dynaforge[wandb]')."""

    enabled: bool = False
    """Log to W&B besides metrics.jsonl."""
    project: str = "dynaforge"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team or user); null uses the default of the W&B login."""
    group: str | None = None
    """Group runs together (e.g. the trials of one study)."""
    name: str | None = None
    """Run name; null uses the run folder's name."""
    tags: list[str] = field(default_factory=list)
    """Tags of the run."""
    mode: Literal["auto", "online", "offline"] = "auto"
    """`auto`: online when an API key is configured (WANDB_API_KEY or `wandb login`), else offline."""
    log_checkpoints: bool = False
    """Upload checkpoints/last.pt as a W&B `model` artifact after every epoch (aliases `latest`,
    `epoch-N`, and `best` when the epoch improved); `dynaforge train --resume-from-artifact` continues
    from one."""


@dataclass
class TrainConfig:
    """The training loop: optimiser, schedule, precision, compilation, the step, checkpoints and logging.

    `preset` fills in switches before the file's and command line's own values (which always win):
    - `debug`: deterministic algorithms, fp32, eager, a log line per step, stop at the first non-finite step.
    - `default`: the field defaults below (fp32, eager, portable).
    - `fast`: bf16 autocast, torch.compile, CUDA-graph capture of the step on CUDA, a log line per 100 steps.
    """

    preset: Literal["debug", "default", "fast"] = "default"
    """Switch set applied beneath explicit values (see the class docstring)."""
    epochs: int = checked(10, check=AT_LEAST_ONE)
    """Passes over the training windows (not read when `time_budget` is set: the budget decides)."""
    time_budget: float | None = checked(None, check=POSITIVE.because("seconds of wall-clock time"))
    """Train for this many seconds of wall-clock time instead of `epochs`; null: train `epochs`. Before the
    first step the engine times a few steps and a validation (then undoes them), turns the time left into a
    whole number of epochs (at least one) and lays the schedule over them; at the end of the first epoch it
    counts again from that epoch's measured time, and once more at the end of the first epoch after a
    quarter of the budget from the epochs since the first (the first pays for warm-up); each time the
    schedule, from where it is, spans the new count. The counts are logged and saved in checkpoints, so a
    run resumed after the last one keeps it and ends with the weights of an uninterrupted one. The plan may
    still miss by a few percent on a busy machine; should a run have spent 1.25 times its budget with epochs
    still planned, it ends after that epoch (a complete run, its schedule cut short, said in the log)."""
    keep_every: int = checked(0, check=NON_NEGATIVE.because("0: keep no snapshots"))
    """Also keep `checkpoints/epoch-N.pt` every this many epochs (0: none); last.pt is overwritten each
    epoch, these stay, for error-against-time curves or for going back."""
    lr: float = checked(1e-3, check=POSITIVE.because("peak learning rate"))
    """Peak learning rate (reached at the end of the warmup)."""
    weight_decay: float = checked(1e-4, check=NON_NEGATIVE)
    """Decoupled weight decay (SGD: L2 penalty); never applied to biases and other 1D parameters."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimiser."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule."""
    grad_clip: float | None = checked(
        None, check=POSITIVE.because("largest gradient norm; null: no absolute limit")
    )
    """Clip the global gradient norm to this value; null: no absolute limit (the norm is logged anyway). An
    absolute limit means something else for every loss: at 1 it held the literature's operator tasks back
    (docs/literature.md); `grad_clip_relative` is the default instead."""
    grad_clip_relative: float | None = checked(
        2.0, check=at_least(1.0).because("a multiple of the recent norms; null: off")
    )
    """Clip the global gradient norm to this multiple of a running mean of the recent steps' (clipped) norms
    (about the last 100, after the first 10): cuts spikes whatever the loss's scale, leaves the usual step
    alone (`dynaforge.train.clip`); null: off. With `grad_clip` both limits apply when both are given; a
    section that sets `grad_clip` without this key clips at that limit alone (configs written before this key
    existed resume as they were trained). The default 2 won on
    every task measured (docs/literature.md): the autoregressive PDEBench task 0.050 against 0.18 with
    clipping at 1 and 0.45 without; the FNO paper's Burgers 0.0014 against 0.0016 unclipped."""
    accumulate: int = checked(1, check=AT_LEAST_ONE)
    """Micro-batches of `data.batch_size` whose gradients are summed per optimiser step."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """fp32; bf16 autocast (CPU and GPU); fp16 autocast with a gradient scaler (CUDA only). FFTs and
    losses always run in fp32."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """torch.compile of the model."""
    cuda_graph: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    """CUDA-graph capture of the whole step (CUDA only)."""
    ema: EMAConfig = field(default_factory=EMAConfig)
    """Exponential moving average of the weights."""
    max_bad_steps: int = checked(10, check=AT_LEAST_ONE)
    """Steps with a non-finite loss or gradient are skipped and counted; this many in a row stop the run."""
    loss: Literal["mse", "relative_l2"] = "relative_l2"
    """Training loss on the frames as `data.normalize` leaves them: relative L2 per sample and frame (the
    default; the training twin of the nRMSE metric) or mean squared error. Relative L2 won on every task
    measured (docs/literature.md, 120 s, one seed, beside dynaforge's other defaults): the FNO paper's Burgers
    0.0021 against 0.0058 with MSE, its Darcy flow 0.094 against 0.64, PDEBench's autoregressive Burgers 0.16
    against 0.58, the quickstart's one-step nRMSE 4.6e-4 against 5.7e-4 (its 20-step rollout the same,
    0.057), and configs/ks1d.yaml's 20-step rollout nRMSE 0.030 against 0.052. A config with a `twophase`
    section and no loss here trains with mse, the only loss two-phase training has."""
    rollout_steps: int = checked(1, check=AT_LEAST_ONE)
    """Model calls unrolled autoregressively per window; the loss covers every predicted frame."""
    log_every: int = checked(50, check=AT_LEAST_ONE)
    """Optimiser steps per logging window (one line of metrics.jsonl, one read of device metrics)."""
    checkpoint_every: int = checked(0, check=NON_NEGATIVE.because("0: at the end of each epoch only"))
    """Also write checkpoints/last.pt every this many optimiser steps (0: at the end of each epoch only)."""
    deterministic: bool = False
    """Deterministic algorithms and cuDNN settings, for bitwise-reproducible runs (slower)."""
    seed: int = 0
    """Seed of the weight initialisation, the data order and every random generator."""
    device: str = "auto"
    """Where to train: `cpu`, `cuda`, `cuda:1` or `auto` (under torchrun: this rank's GPU)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Optional Weights & Biases logging."""

    def __post_init__(self) -> None:
        check_values(self)


TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "debug": {
        "deterministic": True,
        "precision": "fp32",
        "compile": {"enabled": False},
        "cuda_graph": {"enabled": False},
        "log_every": 1,
        "max_bad_steps": 1,
    },
    "default": {},
    "fast": {
        "precision": "bf16",
        "compile": {"enabled": True},
        "cuda_graph": {"enabled": True},
        "log_every": 100,
    },
}
"""`train.preset` name -> train-section values applied beneath the config's own (see `TrainConfig`)."""
