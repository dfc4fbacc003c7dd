"""The shared pseudo-spectral core of every periodic PDE in dynaforge.

Conventions (all systems built on `SpectralSystem`):
- PDE form: u_t = L u + N(u) with L diagonal in Fourier space (linear, stiff) and N the rest.
- Domain: the periodic box [0, L)^d, with the same length L on every axis; L may differ per sample.
- Grid: x_j = j L / n for j = 0 .. n-1 on each axis (left end included, right end excluded).
- Fields: channels first, (batch, channels, *space); the batch holds independent samples stepped together.
- Fourier transforms: `torch.fft.rfftn` over the spatial axes (numpy's normalisation: forward unscaled).
- Dealiasing: the 2/3 rule, modes with 3 |m| >= n on any axis are zeroed in every nonlinear product.
- Time stepping: exponential time differencing Runge-Kutta of order 1-4 (`etdrk.py`) in Fourier space.
- Precision: float32 state by default (complex64 spectra), float64 on request; coefficients are computed in
  float64 and rounded once.
- Reproducibility: a sample's trajectory is the same, byte for byte, whatever batch it is stepped in and
  whatever the torch thread count (`systems/batching.py`: blocks whose size comes from the grid alone, each
  on one intra-op thread). On the CPU every block is padded to its full size, so every transform and
  every elementwise operation a sample goes through has a shape that comes from the grid alone: an FFT
  library that rounds a batch of 3 differently from a batch of 8 cannot show it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Complex, Float, Inexact
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.errors import ConfigError
from dynaforge.systems.base import BlockSteppedSystem, InitialStates, RolloutRun, grid_coordinates
from dynaforge.systems.batching import (
    block_values_for,
    pad_rows,
    power_of_two_block,
    rows_for_lanes,
)
from dynaforge.systems.pde.capture import CapturedSteps
from dynaforge.systems.pde.etdrk import ETDCoefficients, etd_coefficients
from dynaforge.systems.pde.fused import fused_etd_step
from dynaforge.systems.pde.initial import draw_from_range, draw_initial_field
from dynaforge.systems.pde.nonlinear import (
    Nonlinear,
    conservative_quadratic,
    product_grid_size,
    quadratic_multiplier,
    zero_padded,
)
from dynaforge.threads import run_pieces

log = logging.getLogger(__name__)

__all__ = [  # with the names the PDE modules build on, which live in initial.py and nonlinear.py
    "Nonlinear",
    "SpectralOperators",
    "SpectralSystem",
    "conservative_quadratic",
    "dealias_mask",
    "draw_initial_field",
    "etd_step",
    "product_grid_size",
    "quadratic_multiplier",
    "wavenumbers",
    "zero_padded",
]

REAL_TO_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}
KEPT_OPERATORS = 4
"""Shared operators a system keeps from its recent rollouts (`SpectralSystem.shared_operators`)."""


class SpectralOperators(NamedTuple):
    """Everything one batch needs to be stepped: ETD coefficients and the nonlinear term (None if linear).

    `nonlinear` returns R(v) where N(v) = M R(v) and the diagonal factor M (`nonlinear_multiplier`, None when
    a system names none) is folded into the coefficients that weight nonlinear evaluations."""

    coefficients: ETDCoefficients
    nonlinear: Nonlinear | None
    multiplier: Tensor | None = None

    def nonlinear_term(self, v: Complex[Tensor, "batch channels *spectral"]) -> Tensor:
        """N(v) itself, M R(v) (the step never forms it: for tests and diagnostics)."""
        if self.nonlinear is None:
            return torch.zeros_like(v)
        r = self.nonlinear(v)
        return r if self.multiplier is None else self.multiplier * r


def wavenumbers(
    shape: Sequence[int], lengths: Float[Tensor, " batch"], dtype: torch.dtype
) -> tuple[Float[Tensor, "batch 1 *spectral"], ...]:
    """Angular wavenumbers 2 pi m / L per axis, broadcastable against an rfftn spectrum (batch, 1, *spectral).

    All axes but the last use the full FFT frequencies; the last uses the half spectrum of rfftn.
    """
    ndim = len(shape)
    result = []
    for axis, n in enumerate(shape):
        last = axis == ndim - 1
        m = torch.fft.rfftfreq(n, d=1.0 / n) if last else torch.fft.fftfreq(n, d=1.0 / n)
        m = m.to(dtype=torch.float64, device=lengths.device)
        view = [1] * ndim
        view[axis] = m.numel()
        k = 2.0 * math.pi * m.view(1, 1, *view) / lengths.to(torch.float64).view(-1, 1, *([1] * ndim))
        result.append(k.to(dtype))
    return tuple(result)


def dealias_mask(
    shape: Sequence[int], device: torch.device, dtype: torch.dtype
) -> Float[Tensor, "*spectral"]:
    """1 for modes kept by the 2/3 rule (3 |m| < n on every axis), 0 otherwise, on the rfftn layout."""
    ndim = len(shape)
    mask = torch.ones((), dtype=torch.bool, device=device)
    for axis, n in enumerate(shape):
        last = axis == ndim - 1
        m = torch.fft.rfftfreq(n, d=1.0 / n) if last else torch.fft.fftfreq(n, d=1.0 / n)
        keep = (3 * m.abs() < n).to(device)
        view = [1] * ndim
        view[axis] = m.numel()
        mask = mask & keep.view(view)
    return mask.to(dtype)


BLOCK_VALUES = {1: 2**15, 2: 2**17, 3: 2**17}
"""A rollout steps its batch in blocks of about this many state values per number of dimensions (128 samples
of a 256-point grid, 8 of a 128 x 128 grid), so that a block's spectra and temporaries stay in cache and the
allocator recycles them; blocks run side by side on the allowed threads. The size comes from the grid alone,
so a sample's numbers never depend on the batch (`systems/batching.py`; measurements in
docs/reproducibility.md)."""

BLOCK_MAX_SAMPLES = 128
"""CPU blocks hold at most this many samples: every block is padded to its full size, so on a small grid a
larger block would mostly step copies for small batches, while the per-call work it saves is already small
at 128 samples (docs/reproducibility.md)."""


class SpectralSystem(BlockSteppedSystem):
    """A batched pseudo-spectral solver for u_t = L u + N(u); see the module docstring for conventions.

    Subclasses set `name`, `config_class`, `channels`, and implement `operators`, which returns the
    diagonal linear operator L and the nonlinear term for a batch of physical parameters.
    """

    name: ClassVar[str]
    config_class: ClassVar[type[SystemConfig]]
    channels: ClassVar[int] = 1
    supported_ndim: ClassVar[tuple[int, ...]] = (1,)

    def __init__(self, config: SystemConfig) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}"
            )
        self.config = config
        self.ndim = getattr(config, "ndim", 1)
        if self.ndim not in self.supported_ndim:
            raise ConfigError(
                f"system.ndim={self.ndim}: {self.name} supports ndim in {self.supported_ndim}; set one of them"
            )
        self.shape = (config.resolution,) * self.ndim
        self.real_dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.complex_dtype = REAL_TO_COMPLEX[self.real_dtype]
        self.kept_operators: dict[tuple[Any, ...], SpectralOperators] = {}
        """`shared_operators` of recent rollouts, by parameter row, device, config and autograd mode."""

    def __getstate__(self) -> dict[str, Any]:
        """A pickled or copied system leaves its kept operators behind (their nonlinear terms are closures)."""
        return {**self.__dict__, "kept_operators": {}}

    # ---- what a subclass provides -------------------------------------------------------------

    def linear_operator(
        self, k: tuple[Tensor, ...], params: dict[str, Float[Tensor, "batch 1"]]
    ) -> Inexact[Tensor, "batch 1 *spectral"]:
        raise NotImplementedError

    def nonlinear_term(
        self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor
    ) -> Nonlinear | None:
        """The spectral nonlinearity for this batch (None for linear systems), without the factor
        `nonlinear_multiplier` returns: N(v) = multiplier * nonlinear_term(...)(v)."""
        return None

    def nonlinear_multiplier(
        self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor
    ) -> Complex[Tensor, "*multiplier_shape"] | None:
        """A diagonal factor M of the nonlinear term, N(v) = M R(v), in complex128 from float64 wavenumbers
        and parameters (None: no factor). It is folded into the ETD coefficients (`etd_coefficients`), which
        saves one elementwise product per evaluation of N; the dealiasing mask after a product belongs in it.
        """
        return None

    def state_offset(self) -> tuple[float, ...] | None:
        """A constant per channel that the solver subtracts from the state before stepping and adds back to
        every saved frame (None: none). A system whose equations hold a constant forcing term can take it
        into its linear part this way, so that the nonlinear term has no constant to carry (Gray-Scott)."""
        return None

    # ---- parameters and initial conditions -------------------------------------------------------

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.config.parameter_names()

    def draw_parameters(self, rng: np.random.Generator) -> np.ndarray:
        """One sample's physical parameters, in `parameter_names` order (float64)."""
        values = [draw_from_range(getattr(self.config, name), rng) for name in self.parameter_names]
        return np.asarray(values, dtype=np.float64)

    def draw_initial(self, rng: np.random.Generator, parameters: np.ndarray) -> np.ndarray:
        """One sample's initial field (channels, *space), float64, from the configured families."""
        fields = [draw_initial_field(self.config.initial, self.shape, rng) for _ in range(self.channels)]
        return np.stack(fields)

    def draw_samples(self, rngs: Sequence[np.random.Generator]) -> InitialStates:
        """Parameters (batch, P) float64 and initial fields (batch, C, *space) for one generator each.

        Each sample draws from its own generator (parameters first, then the initial field), so a sample
        does not depend on which batch or shard it lands in.
        """
        params, initial = [], []
        for rng in rngs:
            row = self.draw_parameters(rng)
            params.append(row)
            initial.append(self.draw_initial(rng, row))
        params_tensor = torch.from_numpy(np.stack(params)).to(torch.float64)
        return InitialStates(params_tensor, torch.from_numpy(np.stack(initial)))

    # ---- what the store keeps -------------------------------------------------------------------

    rows_per_unit: ClassVar[int] = 1

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The grid x_j = j L / n of every axis, per sample (L: the sample's `domain_length`)."""
        lengths = params[:, list(self.parameter_names).index("domain_length")]
        return grid_coordinates(self.shape, lengths)

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        return {}

    def config_identity(self, device: str) -> dict[str, Any]:
        """The config, less `fused` when it is false (datasets made before the key existed resume)."""
        identity = super().config_identity(device)
        if not identity.get("fused", True):
            identity.pop("fused")
        return identity

    def divergence_cause(self) -> str:
        config = self.config
        spacing = config.domain_length.high / config.resolution
        return (
            f"system.dt={config.dt:g} may be too large for the order-{config.order} ETDRK scheme at resolution "
            f"{config.resolution} (grid spacing {spacing:.3g}; its nonlinear term is explicit); reduce system.dt "
            "or raise system.resolution"
        )

    # ---- stepping -------------------------------------------------------------------------------

    def operators(self, params: Float[Tensor, "batch n_params"], device: torch.device) -> SpectralOperators:
        """ETD coefficients and nonlinear term for a batch of parameter rows.

        Each distinct parameter row is set up once (the contour integral is the costly part), the distinct
        rows padded with copies to whole lane groups (`rows_for_lanes`) so that each row's coefficients do
        not depend on which other rows are set up with it. When all samples share their parameters the
        operators keep a batch axis of 1 and broadcast, which also saves memory traffic in every step;
        otherwise they are gathered back to one row per sample, the ETD coefficients laid out apart
        (`rows_apart`) so that a step multiplies them into the state value for value with the same loops as
        a broadcast coefficient: a sample gets the same numbers alone and among others.
        """
        rows, inverse = torch.unique(
            params.to(device=device, dtype=torch.float64), dim=0, return_inverse=True
        )
        distinct = rows.shape[0]
        spectral_values = math.prod(self.shape[:-1]) * (self.shape[-1] // 2 + 1)
        rows = pad_rows(rows, rows_for_lanes(spectral_values))
        named = {
            name: rows[:, i].view(-1, *([1] * (self.ndim + 1))) for i, name in enumerate(self.parameter_names)
        }
        lengths = named["domain_length"].reshape(-1)
        k64 = wavenumbers(self.shape, lengths, torch.float64)
        # Real operators (heat, Burgers, KS) are promoted here: the coefficients are computed in complex128.
        linear = self.linear_operator(k64, named).to(torch.complex128)
        multiplier = self.nonlinear_multiplier(k64, named, dealias_mask(self.shape, device, torch.float64))
        coefficients = etd_coefficients(
            linear, self.config.dt, self.config.order, self.complex_dtype, multiplier
        )
        k = tuple(axis_k.to(self.real_dtype) for axis_k in k64)
        named_real = {name: value.to(self.real_dtype) for name, value in named.items()}
        index = inverse if distinct > 1 else torch.zeros(1, dtype=torch.long, device=device)
        coefficients = select_rows(coefficients, index)
        k = tuple(axis_k[index] for axis_k in k)
        named_real = {name: value[index] for name, value in named_real.items()}
        mask = dealias_mask(self.shape, device, self.real_dtype)
        if multiplier is not None:
            multiplier = multiplier.to(self.complex_dtype)
            per_row = multiplier.ndim == len(self.shape) + 2 and multiplier.shape[0] > 1
            multiplier = multiplier[index] if per_row else multiplier
        return SpectralOperators(coefficients, self.nonlinear_term(k, named_real, mask), multiplier)

    def shared_operators(self, row: Float[Tensor, "1 n_params"], device: torch.device) -> SpectralOperators:
        """`operators(row)` for a rollout whose samples share one parameter row, kept for the next rollout of
        the same row, device, config and autograd mode (`KEPT_OPERATORS` of them).

        The generate stage rolls a dataset out one batch at a time, and each batch would otherwise redo the
        contour integral of the ETD coefficients: 2.5-78 ms a rollout on one thread, up to 16% of a benchmark
        rollout (Navier-Stokes 256², 8 samples x 25 steps: 78 of 496 ms; Xeon-AMX, 2026-11-29). A step only
        reads its operators, and they are set up on one intra-op thread (`run_pieces`), so kept operators
        give the numbers fresh ones would. A row that requires grad is set up afresh every time."""

        def set_up() -> SpectralOperators:
            (operators,) = run_pieces(lambda r: self.operators(r, device), [row])
            return operators

        if row.requires_grad:
            return set_up()
        key = (
            tuple(row.to("cpu", torch.float64).reshape(-1).tolist()),  # no grad here (checked above)
            str(device),
            repr(self.config),
            torch.is_inference_mode_enabled(),
            torch.is_grad_enabled(),
        )
        kept = self.kept_operators.get(key)
        if kept is None:
            kept = set_up()
            if len(self.kept_operators) >= KEPT_OPERATORS:
                self.kept_operators.clear()
            self.kept_operators[key] = kept
        return kept

    def to_spectral(
        self, u: Float[Tensor, "batch channels *space"]
    ) -> Complex[Tensor, "batch channels *spectral"]:
        return torch.fft.rfftn(u, dim=self.spatial_dims)

    def to_physical(
        self, v: Complex[Tensor, "batch channels *spectral"]
    ) -> Float[Tensor, "batch channels *space"]:
        return torch.fft.irfftn(v, s=self.shape, dim=self.spatial_dims)

    def kept_band(self) -> int:
        """Modes 0 .. band - 1 of the last (half-spectrum) axis survive the 2/3 rule (3 m < n)."""
        return (self.shape[-1] - 1) // 3 + 1

    def to_physical_dealiased(
        self, v: Complex[Tensor, "batch channels *spectral"]
    ) -> Float[Tensor, "batch channels *space"]:
        """`to_physical` of a spectrum already zero beyond the 2/3 band of the last axis: the full-length
        transforms of the other axes run on the kept columns only (about 2/3 of them; 20% less time here)."""
        band = v[..., : self.kept_band()]
        if self.ndim > 1:
            band = torch.fft.ifftn(band, dim=self.spatial_dims[:-1])
        return torch.fft.irfft(zero_padded(band, self.shape[-1] // 2 + 1), n=self.shape[-1], dim=-1)

    def to_spectral_dealiased(
        self, u: Float[Tensor, "batch channels *space"]
    ) -> Complex[Tensor, "batch channels *spectral"]:
        """`to_spectral` of u with the last axis's modes beyond the 2/3 band set to zero (not transformed)."""
        band = self.to_spectral_band(u)
        width = self.shape[-1] // 2 + 1
        return F.pad(band, (0, width - band.shape[-1]))

    def to_spectral_band(
        self, u: Float[Tensor, "batch channels *space"]
    ) -> Complex[Tensor, "batch channels *band"]:
        """The columns 0 .. `kept_band()` - 1 of the last axis of `to_spectral(u)` (the others not computed)."""
        band = torch.fft.rfft(u, dim=-1)[..., : self.kept_band()]
        if self.ndim > 1:
            band = torch.fft.fftn(band, dim=self.spatial_dims[:-1])
        return band

    @property
    def spatial_dims(self) -> tuple[int, ...]:
        return tuple(range(-self.ndim, 0))

    def lane_rows(self) -> int:
        """Blocks hold a multiple of this many samples. Every per-sample tensor of a step (fields, spectra,
        the 2/3 band, products) spans all axes but the last whole, so its size is a multiple of their
        product: elementwise kernels need 16 samples in 1D, 1 on a 128 x 128 grid (`rows_for_lanes`)."""
        return rows_for_lanes(math.prod(self.shape[:-1]))

    def block_samples(self, device: torch.device | None = None) -> int:
        """Samples per block of a rollout on `device` (default the CPU): from the grid and the device kind
        alone (`BLOCK_VALUES` and `BLOCK_MAX_SAMPLES` on the CPU, `batching.GPU_BLOCK_VALUES` on a GPU), a
        power of two."""
        device = device or torch.device("cpu")
        values = self.channels * math.prod(self.shape)
        block = power_of_two_block(
            values, block_values_for(device, BLOCK_VALUES[self.ndim]), self.lane_rows()
        )
        return min(block, max(BLOCK_MAX_SAMPLES, self.lane_rows())) if device.type == "cpu" else block

    def padded_rows(self, device: torch.device) -> int:
        """Every block of a rollout on `device` is padded to a multiple of this many samples (copies of its
        last one). On the CPU it is the whole block, so that every call of a step, the transforms included,
        sees one shape whatever the batch: the lone sample and a partial last block are stepped as a full
        block. On a GPU, where a block is the whole batch (`batching.GPU_BLOCK_VALUES`: 65,536 samples of a
        256-point grid), padding to it would multiply a small batch's work, so blocks are padded to whole
        lane groups only, and a sample's bits alone and in a batch there are measured
        (`scripts/device_checks.sh`), not built in."""
        return self.block_samples(device) if device.type == "cpu" else self.lane_rows()

    def block_stepper(self, run: RolloutRun) -> Callable[[slice], None]:
        """ETD steps of a block (`etd_step`), padded to `padded_rows`; the operators are set up once when
        every sample has the same parameters, else per block.

        `on_step(sample_steps)` is called after every step of a block with the number of samples it
        advanced; on a CUDA device, after every `save_every` steps with the samples times the steps. There
        each block's `save_every` steps and the inverse transform of the frame are captured as one CUDA
        graph (`CapturedSteps`) and replayed, unless `cuda_graph` is false; the kernels are the same, so are
        the numbers. `system.fused` runs `fused_etd_step` instead (fused.py), its compiled kernels captured
        alike (the warm-up step before the capture compiles them).
        """
        initial, params, steps, save_every, frames, report, cuda_graph = run
        device = initial.device
        shared = None
        if bool((params == params[:1]).all()):  # one parameter row: set the operators up once
            shared = self.shared_operators(params[:1], device)
        offset = self.state_offset()
        if offset is not None:
            offset = torch.tensor(offset, dtype=self.real_dtype, device=device).view(-1, *([1] * self.ndim))

        padded = self.padded_rows(device)
        fused = self.config.fused

        def step(v: Tensor, ops: SpectralOperators) -> Tensor:
            if fused and ops.nonlinear is not None:
                return fused_etd_step(v, ops.coefficients, ops.nonlinear)
            return etd_step(v, ops)

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            ops = shared if shared is not None else self.operators(pad_rows(params[rows], padded), device)
            state = pad_rows(initial[rows].to(self.real_dtype), padded)
            frames[rows, 0] = state[:count]
            v = self.to_spectral(state if offset is None else state - offset)

            def write_frame(n: int, physical: Tensor) -> None:
                frame = frames[rows, n // save_every]
                if offset is None:
                    frame.copy_(physical[:count])
                else:  # the offset added as the frame is written: one pass
                    torch.add(physical[:count], offset, out=frame)

            done = 0
            if cuda_graph and device.type == "cuda" and steps >= save_every:
                captured = CapturedSteps.capture(lambda x: step(x, ops), save_every, self.to_physical, v)
                if captured is not None:
                    while done + save_every <= steps:
                        physical = captured.replay()
                        done += save_every
                        write_frame(done, physical)
                        if report is not None:
                            report(count * save_every)
                    v = captured.state
            for n in range(done + 1, steps + 1):
                v = step(v, ops)
                if n % save_every == 0:
                    write_frame(n, self.to_physical(v))
                if report is not None:
                    report(count)

        return run_block


def select_rows(coefficients: ETDCoefficients, index: Tensor) -> ETDCoefficients:
    """The coefficients of parameter rows `index` (one per sample), from those of the distinct rows, each
    laid out by `rows_apart` (a single row stays a broadcast row)."""
    if index.numel() == 1:
        return ETDCoefficients(
            coefficients.order, *(None if c is None else c[index] for c in coefficients[1:])
        )
    return ETDCoefficients(
        coefficients.order, *(None if c is None else rows_apart(c, index) for c in coefficients[1:])
    )


def rows_apart(values: Tensor, index: Tensor) -> Tensor:
    """`values[index]` stored with one unused value between samples.

    An elementwise product of a broadcast coefficient (one row for every sample) with the state runs one
    vector loop per sample, with a scalar remainder at the end of each; a contiguous per-sample coefficient
    would instead let the loop run over the whole block, so the values at the end of each sample would
    take the vector path there and the scalar path when the sample runs alone, which rounds differently for
    complex128 products. Separated rows cannot be merged into one loop: both layouts loop sample by sample.
    """
    per_sample = values[0].numel()
    buffer = torch.empty((index.numel(), per_sample + 1), dtype=values.dtype, device=values.device)
    rows = buffer[:, :per_sample]
    rows.copy_(values.reshape(values.shape[0], per_sample)[index])  # filling the fresh buffer in place
    return rows.view(index.numel(), *values.shape[1:])


def etd_step(v: Tensor, ops: SpectralOperators) -> Tensor:
    """One ETDRK step of order 1-4 (Cox & Matthews 2002) on the spectral state `v`.

    `ops.nonlinear` returns R(v) with N(v) = M R(v), M already folded into the coefficients that weight a
    nonlinear evaluation (`SpectralSystem.nonlinear_multiplier`). Each combination `x + c * y` is one
    `addcmul` pass rather than a product and a sum. Every coefficient multiplies a state-shaped tensor
    directly (the integer factors go on the state side: a power-of-two scaling is exact, so the values are
    those of `4 * f2 * Na`), which keeps the loops of a product the same for broadcast and per-sample
    coefficients (`rows_apart`)."""
    c, N = ops.coefficients, ops.nonlinear
    if N is None:
        return c.E * v  # linear problems are integrated exactly
    Nv = N(v)
    if c.order == 1:
        return torch.addcmul(c.E * v, c.P, Nv)
    if c.order == 2:
        a = torch.addcmul(c.E * v, c.P, Nv)
        return torch.addcmul(a, c.f2, N(a) - Nv)
    Ev = c.E * v
    if c.order == 3:
        a = torch.addcmul(c.E2 * v, c.Q, Nv)
        Na = N(a)
        b = torch.addcmul(Ev, c.P, 2 * Na - Nv)
        return torch.addcmul(torch.addcmul(torch.addcmul(Ev, c.f1, Nv), c.f2, 4 * Na), c.f3, N(b))
    E2v = c.E2 * v
    a = torch.addcmul(E2v, c.Q, Nv)
    Na = N(a)
    b = torch.addcmul(E2v, c.Q, Na)
    Nb = N(b)
    cc = torch.addcmul(c.E2 * a, c.Q, 2 * Nb - Nv)
    out = torch.addcmul(torch.addcmul(Ev, c.f1, Nv), c.f2, 2 * (Na + Nb))
    return torch.addcmul(out, c.f3, N(cc))
