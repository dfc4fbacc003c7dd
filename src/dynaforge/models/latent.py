"""Latent operator: a transformer that advances a grid state through a space of tokens.

encode:  frames (B, history, C, *space) -> conv stem (circular, on the grid) -> patches (a strided
         convolution, `patch` points per token per axis) -> tokens (B, N, width) + Fourier features of the
         token positions
advance: pre-norm transformer blocks whose layer norms are modulated by the conditions (adaptive layer
         norm: shift, scale and a residual gate per block, from log dt and the system parameters; the gates
         start at zero, so every block starts as the identity). Token mixing is standard attention over
         tokens or channel-separated attention (cross-covariance attention: heads attend between feature
         channels across all tokens, linear in the number of tokens); optionally the blocks form a U:
         tokens are merged 2 per axis on the way down and split again, with skip connections, on the way up
decode:  tokens -> grid (a transposed strided convolution) + the stem's features (a long skip, for detail
         finer than a patch) -> convolution to `horizon` frames of update; the state advances by a
         residual update (the last convolution starts at zero: the first prediction is "nothing changes")

Conventions as in `dynaforge.models.base`: periodic grids (1 or 2 spatial axes, each a multiple of
`patch * 2**merge_levels` points), normalised channels-first frames. Encoder, core and decoder are one
module, trained end to end and saved together.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import LatentConfig
from dynaforge.errors import ConfigError
from dynaforge.models.base import GridModel, ModelInput, ModelOutput, ModelShape, frames_prediction

CONV = {1: nn.Conv1d, 2: nn.Conv2d}
CONV_TRANSPOSE = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d}


class Conditions(NamedTuple):
    """What a step is conditioned on: its time step and the system parameters (normalised)."""

    dt: Float[Tensor, " batch"]
    params: Float[Tensor, "batch parameters"]


def default_conditions(config: LatentConfig, like: Tensor) -> Conditions:
    """The model's own dt and the mean parameters (zeros once normalised), for callers that give none, one
    per sample of batch-first `like` (its batch size may be symbolic while exporting)."""
    batch = like.shape[0]
    dt = torch.full((batch,), config.dt, dtype=like.dtype, device=like.device)
    params = torch.zeros((batch, config.parameters), dtype=like.dtype, device=like.device)
    return Conditions(dt=dt, params=params)


def position_features(grid: tuple[int, ...], frequencies: int, like: Tensor) -> Tensor:
    """(N, 2 * frequencies * axes): sin and cos of 2 pi k x for k = 1..frequencies, at the token centres
    x in [0, 1) of every axis (periodic, so the features are too)."""
    axes = [(torch.arange(n, dtype=like.dtype, device=like.device) + 0.5) / n for n in grid]
    mesh = torch.meshgrid(*axes, indexing="ij")
    k = torch.arange(1, frequencies + 1, dtype=like.dtype, device=like.device)
    features = []
    for x in mesh:
        angle = 2 * math.pi * x.reshape(-1, 1) * k
        features.extend([torch.sin(angle), torch.cos(angle)])
    return torch.cat(features, dim=-1)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """Adaptive layer norm's affine part: x * (1 + scale) + shift, per sample."""
    return x * (1 + scale[:, None]) + shift[:, None]


class TokenAttention(nn.Module):
    """Standard multi-head self-attention over tokens."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: Float[Tensor, "batch tokens width"]) -> Float[Tensor, "batch tokens width"]:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)  # (B, h, N, dh)
        mixed = F.scaled_dot_product_attention(q, k, v)
        return self.out(mixed.transpose(1, 2).flatten(2))


class ChannelAttention(nn.Module):
    """Channel-separated attention (cross-covariance attention, El-Nouby et al. 2021): in each head, the
    feature channels attend to each other through their L2-normalised profiles over all tokens; a learned
    temperature per head. Cost grows linearly with the number of tokens."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1, dtype=torch.float32))

    def forward(self, x: Float[Tensor, "batch tokens width"]) -> Float[Tensor, "batch tokens width"]:
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 4, 1)  # (B, h, dh, N)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        weights = torch.softmax(q @ k.transpose(-2, -1) * self.temperature, dim=-1)  # (B, h, dh, dh)
        mixed = weights @ v  # (B, h, dh, N)
        return self.out(mixed.permute(0, 3, 1, 2).flatten(2))


ATTENTION: dict[str, type[nn.Module]] = {"standard": TokenAttention, "channel": ChannelAttention}


class Block(nn.Module):
    """Pre-norm transformer block with adaptive layer norm: x + g1 * mix(ln(x)), then x + g2 * mlp(ln(x)),
    each layer norm shifted and scaled, and each branch gated, by the conditioning vector."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, attention: str) -> None:
        super().__init__()
        self.norm_mix = nn.LayerNorm(width, elementwise_affine=False)
        self.mix = ATTENTION[attention](width, heads)
        self.norm_mlp = nn.LayerNorm(width, elementwise_affine=False)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )
        self.adaptive = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.adaptive.weight)  # gates start at zero: the block starts as the identity
        nn.init.zeros_(self.adaptive.bias)

    def forward(
        self, x: Float[Tensor, "batch tokens width"], condition: Float[Tensor, "batch width"]
    ) -> Float[Tensor, "batch tokens width"]:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaptive(F.silu(condition)).chunk(6, dim=-1)
        x = x + gate1[:, None] * self.mix(modulate(self.norm_mix(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(modulate(self.norm_mlp(x), shift2, scale2))


def merge_tokens(x: Tensor, grid: tuple[int, ...]) -> Tensor:
    """(B, N, D) on `grid` -> (B, N / 2^axes, 2^axes D): neighbouring tokens, 2 per axis, side by side."""
    batch, width = x.shape[0], x.shape[-1]
    if len(grid) == 1:
        return x.reshape(batch, grid[0] // 2, 2 * width)
    h, w = grid
    x = x.reshape(batch, h // 2, 2, w // 2, 2, width).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(batch, (h // 2) * (w // 2), 4 * width)


def split_tokens(x: Tensor, grid: tuple[int, ...]) -> Tensor:
    """The inverse of `merge_tokens`: (B, N', 2^axes D) on the coarse grid -> (B, N, D) on `grid`."""
    batch = x.shape[0]
    if len(grid) == 1:
        return x.reshape(batch, grid[0], -1)
    h, w = grid
    x = x.reshape(batch, h // 2, w // 2, 2, 2, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(batch, h * w, -1)


class LatentOperator(GridModel):
    """See the module docstring. `forward(inputs, conditions)`: conditions default to the config's dt and
    the mean parameters, so the model also fits the plain `ModelInput -> ModelOutput` contract."""

    config: LatentConfig

    def __init__(self, config: LatentConfig, shape: ModelShape) -> None:
        super().__init__(config, shape, CONV, "the latent operator")
        dims, width = shape.spatial_dims, config.width
        conv = CONV[dims]
        self.stem = nn.Sequential(
            conv(shape.in_channels, config.stem, 3, padding=1, padding_mode="circular"), nn.GELU()
        )
        self.patchify = conv(config.stem, width, config.patch, stride=config.patch)
        self.position = nn.Linear(2 * config.position_features * dims, width)
        self.condition = nn.Sequential(
            nn.Linear(1 + config.parameters, width), nn.SiLU(), nn.Linear(width, width)
        )
        kinds = [self.attention_kind(i) for i in range(config.depth)]
        self.blocks = nn.ModuleList(Block(width, config.heads, config.mlp_ratio, k) for k in kinds)
        merged = 2**dims
        self.merges = nn.ModuleList(nn.Linear(merged * width, width) for _ in range(config.merge_levels))
        self.splits = nn.ModuleList(nn.Linear(width, merged * width) for _ in range(config.merge_levels))
        self.skips = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(config.merge_levels))
        self.norm_out = nn.LayerNorm(width, elementwise_affine=False)
        self.adaptive_out = nn.Linear(width, 2 * width)
        nn.init.zeros_(self.adaptive_out.weight)
        nn.init.zeros_(self.adaptive_out.bias)
        self.unpatchify = CONV_TRANSPOSE[dims](width, config.stem, config.patch, stride=config.patch)
        self.head = conv(config.stem, shape.out_channels, 3, padding=1, padding_mode="circular")
        if config.residual:
            nn.init.zeros_(self.head.weight)  # start as "nothing changes"
            nn.init.zeros_(self.head.bias)

    def attention_kind(self, index: int) -> str:
        if self.config.attention == "alternate":
            return "standard" if index % 2 == 0 else "channel"
        return self.config.attention

    def check_grid(self, space: tuple[int, ...]) -> None:
        multiple = self.config.patch * 2**self.config.merge_levels
        if any(n % multiple for n in space):
            raise ConfigError(
                f"grid {space} must be a multiple of patch * 2**merge_levels = {multiple} along every axis; "
                "change model.patch or model.merge_levels, or resample the data"
            )

    def forward(self, inputs: ModelInput, conditions: Conditions | None = None) -> ModelOutput:
        def network(stacked: Tensor) -> Tensor:
            self.check_grid(tuple(inputs.frames.shape[3:]))
            given = default_conditions(self.config, inputs.frames) if conditions is None else conditions
            features = self.stem(stacked)  # (B, stem, *space)
            tokens, grid = self.encode(features)
            tokens = self.advance(tokens, grid, self.embed_conditions(given, tokens))
            return self.decode(tokens, grid, features)

        return frames_prediction(inputs, self.shape, self.config.residual, network)

    def embed_conditions(self, conditions: Conditions, like: Tensor) -> Float[Tensor, "batch width"]:
        log_dt = torch.log(conditions.dt.to(like.dtype))[:, None]
        return self.condition(torch.cat([log_dt, conditions.params.to(like.dtype)], dim=-1))

    def encode(self, features: Tensor) -> tuple[Float[Tensor, "batch tokens width"], tuple[int, ...]]:
        patches = self.patchify(features)  # (B, D, *grid)
        grid = tuple(patches.shape[2:])
        tokens = patches.flatten(2).transpose(1, 2)
        positions = position_features(grid, self.config.position_features, tokens)
        return tokens + self.position(positions), grid

    def advance(
        self, tokens: Tensor, grid: tuple[int, ...], condition: Float[Tensor, "batch width"]
    ) -> Float[Tensor, "batch tokens width"]:
        """The blocks; with merge levels, the first ones each end by merging tokens, the last ones each
        start by splitting them and mixing in the skip connection saved at that resolution."""
        levels = self.config.merge_levels
        skips, grids = [], []
        for i, block in enumerate(self.blocks):
            up = i - (len(self.blocks) - levels)
            if up >= 0:
                level = levels - 1 - up
                tokens = split_tokens(self.splits[level](tokens), grids[level])
                tokens = self.skips[level](torch.cat([tokens, skips[level]], dim=-1))
            tokens = block(tokens, condition)
            if i < levels:
                skips.append(tokens)
                grids.append(grid)
                tokens = self.merges[i](merge_tokens(tokens, grid))
                grid = tuple(n // 2 for n in grid)
        shift, scale = self.adaptive_out(F.silu(condition)).chunk(2, dim=-1)
        return modulate(self.norm_out(tokens), shift, scale)

    def decode(self, tokens: Tensor, grid: tuple[int, ...], features: Tensor) -> Tensor:
        patches = tokens.transpose(1, 2).reshape(tokens.shape[0], -1, *grid)
        return self.head(F.gelu(self.unpatchify(patches) + features))
