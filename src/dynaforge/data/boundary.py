"""Boundary values and coefficients as input channels (`data.boundary_channels`, `data.parameter_channels`).

A walled system stores each sample's boundary values as parameters (`left_value`, `left_amplitude`,
`left_frequency`, ..., `lid_speed`; `store.format.is_boundary_parameter`). Those that differ between the
train samples are given to a surrogate as extra channels after the physical ones: one field per parameter,
constant in space and time, equal to that sample's value. They are normalised with the parameter's mean and
standard deviation over the train samples (appended to the fields' normaliser), held from the input like an
obstacle mask (`ModelShape.held`: not predicted, carried along in rollouts) and cut off before scoring. The
checkpoint records their names (`ModelShape.boundary`), so evaluation appends the same channels to its test
trajectories. A value that varies in time (an oscillating wall) is given by its parameters, not by its value
at the frame's time: the phase reaches the model through the frames (a Dirichlet wall's nodes).

Coefficient channels (`data.parameter_channels`: parameter names such as `viscosity`) are given the same
way after the boundary ones, whether they vary between samples or not, and are 0 for a system that does not
have the parameter (Kuramoto-Sivashinsky in a mixture conditioned on `viscosity`); the checkpoint names them
(`ModelShape.parameters`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.data.normalize import Normalizer
from dynaforge.errors import ConfigError
from dynaforge.store import DatasetFolder
from dynaforge.store.format import (
    SplitArrays,
    append_parameter_channels,
    is_boundary_parameter,
    parameter_values,
)
from dynaforge.store.layout import fields_from_disk


def varying_boundary_parameters(names: Sequence[str], params: np.ndarray) -> tuple[str, ...]:
    """The boundary parameters among `names` whose values differ between the samples `params` (N, P)."""
    chosen = []
    for column, name in enumerate(names):
        values = params[:, column]
        if is_boundary_parameter(name) and values.size and np.ptp(values) > 0:
            chosen.append(name)
    return tuple(chosen)


def boundary_fields(
    params: np.ndarray,
    names: Sequence[str],
    boundary: Sequence[str],
    frames: int,
    space: Sequence[int],
    parameters: Sequence[str] = (),
) -> Float[Tensor, "samples time given *space"]:
    """Each sample's `boundary` parameters, then its `parameters` (0 where the data lacks one; from
    `params` (N, P), columns named `names`), broadcast to constant fields
    (N, frames, len(boundary) + len(parameters), *space), float32, physical units."""
    chosen = [*boundary, *parameters]
    values = torch.as_tensor(parameter_values(params, names, chosen, parameters), dtype=torch.float32)
    view = values.view(values.shape[0], 1, values.shape[1], *(1 for _ in space))
    return view.expand(values.shape[0], frames, values.shape[1], *space)


def with_boundary_channels(
    frames: Float[Tensor, "samples time channels *space"],
    params: np.ndarray,
    names: Sequence[str],
    boundary: Sequence[str],
    parameters: Sequence[str] = (),
) -> Float[Tensor, "samples time all *space"]:
    """Physical frames (N, T, C, *space) with the `boundary` parameters, then the coefficient channels
    `parameters`, appended as constant channels."""
    if not boundary and not parameters:
        return frames
    fields = boundary_fields(params, names, boundary, frames.shape[1], frames.shape[3:], parameters)
    return torch.cat([frames, fields.to(frames.device, frames.dtype)], dim=2)


def split_frames_with_boundary(
    folder: DatasetFolder, split: str, boundary: Sequence[str], parameters: Sequence[str] = ()
) -> Float[Tensor, "samples time all *space"]:
    """The split's physical trajectories (N, T, C, *space) with the `boundary` and `parameters` channels
    appended."""
    if not boundary and not parameters:
        return folder.split_frames(split)
    arrays = folder.read_split(split)
    return with_boundary_channels(
        fields_from_disk(arrays.fields), arrays.params, arrays.param_names, boundary, parameters
    )


def stored_fields_with_boundary(
    fields: np.ndarray,
    params: np.ndarray,
    names: Sequence[str],
    boundary: Sequence[str],
    parameters: Sequence[str] = (),
) -> np.ndarray:
    """Stored-layout fields (N, T, *space, C) float32 with the `boundary` and `parameters` channels appended
    last (what evaluation feeds a model trained with them)."""
    if not boundary and not parameters:
        return fields
    chosen = [*boundary, *parameters]
    return append_parameter_channels(fields, params, names, chosen, axis=-1, zero_missing=parameters)


def split_with_boundary(
    arrays: SplitArrays, boundary: Sequence[str], parameters: Sequence[str] = ()
) -> SplitArrays:
    """A split read by `DatasetFolder.read_split` with the `boundary` and `parameters` channels appended to
    its fields."""
    if not boundary and not parameters:
        return arrays
    fields = stored_fields_with_boundary(
        arrays.fields, arrays.params, arrays.param_names, boundary, parameters
    )
    return arrays._replace(fields=fields)


def boundary_normalizer(
    normalizer: Normalizer,
    params: np.ndarray,
    names: Sequence[str],
    boundary: Sequence[str],
    parameters: Sequence[str] = (),
) -> Normalizer:
    """`normalizer` of the physical channels, followed by each `boundary` and `parameters` parameter's mean
    and standard deviation over the train samples `params` (N, P) (a coefficient the data lacks is 0)."""
    values = parameter_values(params, names, [*boundary, *parameters], parameters)
    return Normalizer(
        list(normalizer.mean) + values.mean(axis=0).tolist(),
        list(normalizer.std) + values.std(axis=0).tolist(),
    )


def check_parameter_channels(parameters: Sequence[str], systems: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Refuse coefficient channels (`data.parameter_channels`) a misspelling would make all zeros: in a
    mixture, a name that is a parameter of none of the `systems` ((name, parameter names) each); for one
    system, names none of which it has (it may lack some: a system fine-tuned from a mixture's model)."""
    if len(set(parameters)) != len(parameters):
        raise ConfigError(f"data.parameter_channels names a parameter twice: {list(parameters)}")
    known = {name for _, names in systems for name in names}
    unknown = [name for name in parameters if name not in known]
    if unknown and (len(systems) > 1 or len(unknown) == len(parameters)):
        described = "; ".join(f"{system}: {list(names)}" for system, names in systems)
        raise ConfigError(
            f"data.parameter_channels: {unknown} is a parameter of none of the systems ({described}); name "
            "parameters the systems record"
        )


def boundary_parameters_of(names: Sequence[str], params: np.ndarray) -> tuple[str, ...]:
    """The boundary parameters to give as channels (`data.boundary_channels`), refused when none differ."""
    boundary = varying_boundary_parameters(names, params)
    if not boundary:
        raise ConfigError(
            "data.boundary_channels: the train samples share every boundary value (parameters "
            f"{list(names)}), so there is nothing per sample to give the model; set it false, or draw the "
            "boundary values per sample (system.boundary.<side>.value: {low, high})"
        )
    return boundary
