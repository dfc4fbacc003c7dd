"""Optimisers: Adam, AdamW, SGD with momentum, and a Muon + AdamW hybrid behind one optimiser object.

Weight decay never touches biases and norm scales (parameters with fewer than 2 dimensions).

The hybrid (`train.optimizer.name=muon`) routes each parameter by what it is:
- to `torch.optim.Muon`: matrix-shaped weights, i.e. 2D weights (linear layers, attention projections)
  and convolution kernels, which Muon sees as (out, in x kernel) matrices;
- to AdamW: everything else: biases, norm scales, embeddings, other parameters of 3 or more dimensions,
  the FNO's spectral weights (complex weights stored as real pairs; to Muon only with `muon_spectral`),
  and any parameter whose name matches a `muon_exclude` pattern.

`torch.optim.Muon` only takes 2D parameters, so a convolution kernel (or a spectral weight) is handed to it
as a 2D *proxy*: a Parameter sharing the kernel's memory, viewed as a matrix (rows = dimension 0, the
other dimensions flattened in memory order). After every backward a gradient hook points the proxy's
gradient at the kernel's gradient, viewed the same way, so Muon's in-place updates land in the kernel and
gradient clipping, unscaling and all-reduces done on the kernel's gradient are what Muon reads.

Non-finite steps are skipped without a host sync: the trainer sets `optimizer.found_inf` (a 0-dim device
tensor, 1 to skip) before `step()`, the protocol of `torch.amp.GradScaler`. Fused Adam, AdamW and SGD
honour it inside their kernels; every other optimiser runs through `masked_step` (step, then restore the
parameters and state where `found_inf` is set).
"""

from __future__ import annotations

import fnmatch
import logging
from collections import ChainMap
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from dynaforge.config import OptimizerConfig, TrainConfig
from dynaforge.errors import ConfigError
from dynaforge.models.spectral import SpectralConv

log = logging.getLogger(__name__)

NamedParameters = Sequence[tuple[str, nn.Parameter]]


def named_trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: matrices and kernels (2 or more dims) decay; biases, norm scales and other vectors do not."""
    return decay_groups(named_trainable_parameters(model), weight_decay)


def decay_groups(named: NamedParameters, weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def fused_supported(parameters: Iterable[Tensor]) -> bool:
    """True when every parameter is a floating tensor on a device with fused optimiser kernels."""
    devices = _get_fused_kernels_supported_devices()
    return all(p.is_floating_point() and p.device.type in devices for p in parameters)


def build_optimizer(model: nn.Module, config: TrainConfig, capturable: bool = False) -> torch.optim.Optimizer:
    """The optimiser `config.optimizer` names, over `model`'s trainable parameters.

    `capturable`: state and learning rate on the device, so that the step can be captured in a CUDA graph
    (Adam and AdamW only).
    """
    settings = config.optimizer
    named = named_trainable_parameters(model)
    if not named:
        raise ConfigError("the model has no trainable parameters")
    if settings.name == "muon":
        return build_hybrid(model, config)
    fused = resolve_fused(settings, [p for _, p in named])
    groups = [g for g in decay_groups(named, config.weight_decay) if g["params"]]
    if settings.name == "sgd":
        sgd = torch.optim.SGD(
            groups, lr=config.lr, momentum=settings.momentum, nesterov=settings.nesterov, fused=fused
        )
        start_momentum_at_zero(sgd)
        return sgd
    cls = torch.optim.AdamW if settings.name == "adamw" else torch.optim.Adam
    lr: float | Tensor = config.lr
    if capturable:
        lr = torch.tensor(config.lr, dtype=torch.float32, device=named[0][1].device)
    return cls(
        groups,
        lr=lr,
        betas=(settings.betas[0], settings.betas[1]),
        eps=settings.eps,
        fused=fused,
        capturable=capturable,
    )


def start_momentum_at_zero(optimizer: torch.optim.SGD) -> None:
    """Create SGD's momentum buffers as zeros before the first step.

    Fused SGD allocates them uninitialised (`empty_like`) at its first step and fills them in the kernel;
    when that step is skipped (`found_inf`) they stay garbage for every later step. Starting from zeros
    changes nothing otherwise: with no dampening, 0 * momentum + g equals the first gradient SGD would
    copy in.
    """
    if optimizer.defaults["momentum"] == 0:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def resolve_fused(settings: OptimizerConfig, parameters: Sequence[Tensor]) -> bool:
    available = fused_supported(parameters)
    if settings.fused and not available:
        raise ConfigError(
            "train.optimizer.fused=true, but fused kernels do not exist for these parameters' device or "
            "dtype; set train.optimizer.fused=null (use them where available) or false"
        )
    return available if settings.fused is None else settings.fused


# ---- the Muon + AdamW hybrid ---------------------------------------------------------------------


def goes_to_muon(
    module: nn.Module, local_name: str, full_name: str, p: Tensor, settings: OptimizerConfig
) -> bool:
    """Whether parameter `local_name` of `module` (full dotted name `full_name`) is a matrix for Muon."""
    if any(fnmatch.fnmatchcase(full_name, pattern) for pattern in settings.muon_exclude):
        return False
    if isinstance(module, SpectralConv):
        return settings.muon_spectral
    if isinstance(module, nn.Embedding | nn.EmbeddingBag) or p.ndim < 2:
        return False
    if isinstance(module, nn.modules.conv._ConvNd) and local_name == "weight":
        return True
    return p.ndim == 2


def route_parameters(model: nn.Module, settings: OptimizerConfig) -> tuple[NamedParameters, NamedParameters]:
    """(Muon's, AdamW's) named trainable parameters; a shared parameter is routed once."""
    muon, adamw, seen = [], [], set()
    for module_name, module in model.named_modules():
        for local_name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            full_name = f"{module_name}.{local_name}" if module_name else local_name
            target = muon if goes_to_muon(module, local_name, full_name, p, settings) else adamw
            target.append((full_name, p))
    return muon, adamw


def memory_order(t: Tensor) -> list[int]:
    """Dimension 0, then the others from the largest stride to the smallest."""
    return [0, *sorted(range(1, t.ndim), key=lambda d: -t.stride(d))]


def matrix_view(t: Tensor, order: Sequence[int]) -> Tensor:
    """(d0, d1, ...) -> (d0, prod(rest)) as a view sharing `t`'s memory (raises if no such view exists)."""
    return t.permute(*order).view(t.shape[0], -1)


class MatrixProxy:
    """A 2D Parameter sharing the memory of an N-D parameter, whose gradient follows the parameter's."""

    def __init__(self, param: nn.Parameter) -> None:
        self.param = param
        self.order = memory_order(param)
        try:
            self.matrix = nn.Parameter(matrix_view(param.detach(), self.order))
        except RuntimeError as error:
            raise ConfigError(
                f"a parameter of shape {tuple(param.shape)} and strides {param.stride()} has no 2D view; "
                "keep it on AdamW with train.optimizer.muon_exclude"
            ) from error
        param.register_post_accumulate_grad_hook(self.share_gradient)

    def share_gradient(self, param: Tensor) -> None:
        grad = param.grad
        if grad is None:
            return
        try:
            self.matrix.grad = matrix_view(grad, self.order)
        except RuntimeError:
            # The gradient came in another memory layout: give it the parameter's, then view it.
            param.grad = torch.empty_like(param).copy_(grad)
            self.matrix.grad = matrix_view(param.grad, self.order)


class HybridOptimizer(torch.optim.Optimizer):
    """Muon for matrices, AdamW for the rest, as one optimiser (see the module docstring).

    `param_groups` are the inner optimisers' own group dicts (Muon's first), so a scheduler that sets
    `group["lr"]` drives both; `state_dict()` holds both inner state dicts; `state` reads through to both.
    """

    _step_supports_amp_scaling = True  # honours `found_inf` (see `step`)

    def __init__(
        self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer, proxies: Sequence[MatrixProxy] = ()
    ) -> None:
        self.inner = {"muon": muon, "adamw": adamw}
        self.proxies = list(proxies)
        super().__init__([g for o in self.inner.values() for g in o.param_groups], defaults={})
        self.state = ChainMap(muon.state, adamw.state)  # type: ignore[assignment]
        self.built = True

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            # A caller's bug, not a config's: the engine never passes a closure.
            raise ValueError("HybridOptimizer.step takes no closure")
        found_inf = getattr(self, "found_inf", None)
        for optimizer in self.inner.values():
            step_unless(optimizer, found_inf)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.inner.values():
            optimizer.zero_grad(set_to_none=set_to_none)
        for proxy in self.proxies:  # the N-D parameters behind Muon's 2D proxies
            if proxy.param.grad is not None:
                if set_to_none:
                    proxy.param.grad = None
                else:
                    proxy.param.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {name: optimizer.state_dict() for name, optimizer in self.inner.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if set(state_dict) != set(self.inner):
            raise ConfigError(
                f"not a Muon + AdamW optimiser state (keys {sorted(state_dict)}); was the checkpoint trained "
                "with another train.optimizer.name?"
            )
        for name, optimizer in self.inner.items():
            optimizer.load_state_dict(state_dict[name])
        # Loading replaces the inner group dicts: share the new ones, or schedulers would set stale copies.
        self.param_groups = [g for o in self.inner.values() for g in o.param_groups]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "built", False):
            raise NotImplementedError("add groups to an inner optimiser (HybridOptimizer.inner) instead")
        super().add_param_group(param_group)


def build_hybrid(model: nn.Module, config: TrainConfig) -> HybridOptimizer:
    settings = config.optimizer
    muon_named, adamw_named = route_parameters(model, settings)
    if not muon_named:
        raise ConfigError(
            "train.optimizer.name=muon, but the model has no matrix-shaped weights for Muon; use adamw"
        )
    proxies = [MatrixProxy(p) for _, p in muon_named if p.ndim != 2]
    by_param = {id(proxy.param): proxy.matrix for proxy in proxies}
    matrices = [by_param.get(id(p), p) for _, p in muon_named]
    muon = torch.optim.Muon(
        matrices,
        lr=settings.muon_lr or config.lr,
        weight_decay=config.weight_decay,
        momentum=settings.muon_momentum,
        ns_steps=settings.muon_ns_steps,
        adjust_lr_fn=settings.muon_adjust_lr,
    )
    rest = [p for _, p in adamw_named]
    groups = [g for g in decay_groups(adamw_named, config.weight_decay) if g["params"]]
    adamw = torch.optim.AdamW(
        groups,
        lr=config.lr,
        betas=(settings.betas[0], settings.betas[1]),
        eps=settings.eps,
        fused=resolve_fused(settings, rest) if rest else False,
    )
    log.info(
        "Muon + AdamW: %d matrices (%d parameters) to Muon, %d tensors (%d parameters) to AdamW",
        len(muon_named),
        sum(p.numel() for _, p in muon_named),
        len(adamw_named),
        sum(p.numel() for _, p in adamw_named),
    )
    return HybridOptimizer(muon, adamw, proxies)


# ---- skipping a step on the device ----------------------------------------------------------------


def step_unless(optimizer: torch.optim.Optimizer, found_inf: Tensor | None) -> None:
    """`optimizer.step()`, without any effect when the 0-dim tensor `found_inf` is non-zero; no host sync."""
    if found_inf is None:
        optimizer.step()
    elif getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    else:
        masked_step(optimizer, found_inf)


@torch.no_grad()
def masked_step(optimizer: torch.optim.Optimizer, found_inf: Tensor) -> None:
    """Step, then put back the parameters and optimiser state where `found_inf` is set.

    State created by this step (the first one) is reset to zeros, the value a fresh optimiser starts from
    (an SGD momentum buffer starts as the first gradient, which it equals again after one zero-momentum
    step). Costs a copy of the stepped parameters and their state; state kept on another device than
    `found_inf` (a non-capturable Adam's step counts, on the CPU) costs a host sync to move `found_inf`.
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    saved = [p.detach().clone() for p in params]
    saved_state = [
        {k: v.clone() for k, v in optimizer.state[p].items() if isinstance(v, Tensor)}
        if p in optimizer.state
        else {}
        for p in params
    ]
    optimizer.step()
    skip = found_inf != 0
    for p, old, old_state in zip(params, saved, saved_state):
        # In place on purpose: the parameters and state tensors are what the optimiser and model hold.
        p.copy_(torch.where(skip.to(p.device), old, p))
        for key, value in optimizer.state[p].items():
            if isinstance(value, Tensor):
                before = old_state.get(key, torch.zeros_like(value))
                value.copy_(torch.where(skip.to(value.device), before, value))
