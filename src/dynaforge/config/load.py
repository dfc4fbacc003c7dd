"""Loading, overriding and saving configs: YAML presets, dotted overrides, validation with errors
that name the key, the whole `Config`."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dynaforge.atomic import atomic_write_text
from dynaforge.config.base import ConfigError, Range, check_fields
from dynaforge.config.data import DataConfig, DatasetConfig
from dynaforge.config.evaluate import EvaluateConfig
from dynaforge.config.mixture import MixtureMember, check_mixture
from dynaforge.config.models import MODEL_CONFIGS, FNOConfig, ModelConfig
from dynaforge.config.nbody import LEGACY_TIMESTEPPER_KEYS, NBodyConfig, TimestepperConfig
from dynaforge.config.stack import StagesConfig
from dynaforge.config.systems import DEFAULT_SYSTEM, SystemConfig, system_config_class
from dynaforge.config.train import TRAIN_PRESETS, TrainConfig
from dynaforge.config.tune import TuneConfig
from dynaforge.config.two_phase import TwoPhaseConfig

log = logging.getLogger(__name__)


def default_system() -> SystemConfig:
    """The `system` section of a config that has none: `DEFAULT_SYSTEM` with its defaults."""
    return system_config_class(DEFAULT_SYSTEM)()


@dataclass
class Config:
    """Everything one run needs; each section belongs to one stage of the pipeline."""

    system: SystemConfig | NBodyConfig = field(default_factory=default_system)
    """The ground-truth simulator and its parameter ranges."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Sizes, sharding and seeds of the generated dataset."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training windows, normalisation and batching."""
    model: ModelConfig = field(default_factory=FNOConfig)
    """The neural surrogate (chosen by `model.name`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """Rollouts, metrics and the report on the test split."""
    timestepper: TimestepperConfig = field(default_factory=TimestepperConfig)
    """The learned N-body step controller and its training."""
    stages: StagesConfig = field(default_factory=StagesConfig)
    """The staged latent stack (`dynaforge train ... stage=all`)."""
    tune: TuneConfig = field(default_factory=TuneConfig)
    """The hyper-parameter search of `dynaforge tune` (ignored by the other verbs)."""
    twophase: TwoPhaseConfig = field(default_factory=TwoPhaseConfig)
    """Two-phase (equilibrium propagation) training of an energy-based model."""
    mixture: list[MixtureMember] = field(default_factory=list)
    """Systems the stream draws trajectories from, each with a weight (empty: `system` alone; a mixture
    trains from the stream only, docs/mixture.md)."""

    def __post_init__(self) -> None:
        check_mixture(self.mixture)
        if self.mixture and self.data.source != "stream":
            raise ConfigError(
                "a mixture is generated while training runs: set data.source=stream (or drop `mixture` "
                "to use the dataset folder's system)"
            )


def load_config(path: str | Path | Config | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML preset (or start from a `Config`, or from the defaults when `path` is None) and apply
    dotted `key=value` overrides."""
    if isinstance(path, Config) and not overrides:
        return path
    try:
        if isinstance(path, Config):
            base = OmegaConf.create(config_to_dict(path))
        else:
            base = OmegaConf.load(path) if path is not None else OmegaConf.create({})
    except FileNotFoundError as error:
        raise ConfigError(f"config file not found: {path}") from error
    except (yaml.YAMLError, OmegaConfBaseException) as error:
        raise ConfigError(f"cannot parse {path}: {error}") from error
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
    try:
        # A Range written as a plain number is expanded first, so that `x.low=...` can override it.
        expanded = _expand_range_shorthand(Config, OmegaConf.to_container(base))
        base = OmegaConf.create(_mixture_by_index(expanded))
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
        data = OmegaConf.to_container(merged, resolve=True)
    except (OmegaConfBaseException, TypeError) as error:
        raise ConfigError(f"cannot apply overrides {list(overrides)}: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    data = _mixture_as_list(data)
    _, moved = upgrade_legacy_keys(data)
    if moved:
        log.warning(
            "%s: %s now sit under timestepper.train (read from there); move them in the file",
            path or "overrides",
            ", ".join(moved),
        )
    return config_from_dict(data)


def _mixture_by_index(data: Any) -> Any:
    """`data` with its `mixture` list written as a mapping {"0": ..., "1": ...}, so that dotted overrides
    (`mixture.1.weight=2`) merge into its items (`_mixture_as_list` turns it back)."""
    if isinstance(data, dict) and isinstance(data.get("mixture"), list):
        return {**data, "mixture": {str(i): item for i, item in enumerate(data["mixture"])}}
    return data


def _mixture_as_list(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `_mixture_by_index`: items numbered 0, 1, ..., n - 1, in order."""
    items = data.get("mixture")
    if not isinstance(items, Mapping):
        return data
    keys = sorted(items, key=lambda key: int(key) if str(key).isdigit() else -1)
    if [str(key) for key in keys] != [str(i) for i in range(len(keys))]:
        raise ConfigError(
            f"mixture items are numbered 0 to n - 1 (got {', '.join(map(str, keys))}); write the mixture as "
            "a list in the file, or override an item that it lists (mixture.0.weight=2)"
        )
    return {**data, "mixture": [items[key] for key in keys]}


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Build a validated `Config` from plain data (the inverse of `config_to_dict`); keys of earlier
    versions are read where they live now (`upgrade_legacy_keys`)."""
    return _build(Config, apply_train_preset(upgrade_legacy_keys(data)[0]), "")


def upgrade_legacy_keys(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`data` with the keys of earlier versions moved to where they live now, and the keys it moved.

    `timestepper.lr`, `.optimizer`, ... (`LEGACY_TIMESTEPPER_KEYS`) became `timestepper.train.*` when the
    controller moved onto the training engine; `timestepper.lbfgs_steps` went with its L-BFGS phase (a
    saved 0 is dropped). Configs and checkpoints written before then load unchanged.
    """
    data, renamed = _upgrade_space_keys(data)
    timestepper = data.get("timestepper")
    if not isinstance(timestepper, Mapping):
        return data, renamed
    moved = [key for key in LEGACY_TIMESTEPPER_KEYS if key in timestepper]
    if not moved and "lbfgs_steps" not in timestepper:
        return data, renamed
    if timestepper.get("lbfgs_steps"):
        raise ConfigError(
            "timestepper.lbfgs_steps: the L-BFGS phase after Adam was removed (the controller trains on the "
            "training engine, with one optimiser); drop the key or set it to 0"
        )
    section = {k: v for k, v in timestepper.items() if k not in moved and k != "lbfgs_steps"}
    train = section.get("train", {})
    if not isinstance(train, Mapping):
        return {**data, "timestepper": section}, renamed  # _build reports the bad section
    clashes = [key for key in moved if key in train]
    if clashes:
        raise ConfigError(
            f"timestepper.{clashes[0]} and timestepper.train.{clashes[0]} are both set; keep "
            f"timestepper.train.{clashes[0]}"
        )
    section["train"] = {**train, **{key: timestepper[key] for key in moved}}
    return {**data, "timestepper": section}, renamed + [f"timestepper.{key}" for key in moved]


def _upgrade_space_keys(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`tune.space` keys `timestepper.lr`, ... renamed `timestepper.train.lr`, ..., and the names changed."""
    tune = data.get("tune")
    space = tune.get("space") if isinstance(tune, Mapping) else None
    if not isinstance(space, Mapping):
        return dict(data), []
    legacy = {f"timestepper.{key}" for key in LEGACY_TIMESTEPPER_KEYS}
    renamed = [key for key in space if key in legacy or key.rsplit(".", 1)[0] in legacy]
    if not renamed:
        return dict(data), []
    upgraded = {
        key.replace("timestepper.", "timestepper.train.", 1) if key in renamed else key: value
        for key, value in space.items()
    }
    return {**data, "tune": {**tune, "space": upgraded}}, [f"tune.space key {key}" for key in renamed]


def apply_train_preset(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with the values of `train.preset` (and `timestepper.train.preset`) filled in beneath the
    section's own values, and a two-phase config's loss (`two_phase_loss`)."""
    result = {**data, "train": _with_preset(two_phase_loss(data).get("train", {}), "train")}
    timestepper = data.get("timestepper", {})
    if isinstance(timestepper, Mapping) and "train" in timestepper:
        train = _with_preset(timestepper["train"], "timestepper.train")
        result["timestepper"] = {**timestepper, "train": train}
    return result


def two_phase_loss(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config with a `twophase` section whose train section names no loss trains with `mse`, the only
    loss two-phase training has (its nudging force is that of 1/2 |y - t|^2); `relative_l2`, the default,
    is the window engine's. Saved configs name their loss, so this touches only configs written by hand."""
    train = data.get("train", {})
    if "twophase" not in data or not isinstance(train, Mapping) or "loss" in train:
        return data
    return {**data, "train": {**train, "loss": "mse"}}


def _with_preset(section: Any, where: str) -> Any:
    if not isinstance(section, Mapping):
        return section  # _build reports the bad section
    name = section.get("preset", "default")
    if name not in TRAIN_PRESETS:
        raise ConfigError(f"{where}.preset={name!r} is not valid; choose one of: {', '.join(TRAIN_PRESETS)}")
    return absolute_clip_alone(_merge_beneath(TRAIN_PRESETS[name], section))


def absolute_clip_alone(section: Mapping[str, Any]) -> dict[str, Any]:
    """A train section that sets an absolute `grad_clip` and says nothing of `grad_clip_relative` clips at
    that limit alone: the relative default is for sections that chose no clipping. So a run config written
    before relative clipping existed (its `grad_clip: 1.0` resolved, no relative key) resumes as it was
    trained, and `train.grad_clip=0.5` means clipping at 0.5."""
    if section.get("grad_clip") is not None and "grad_clip_relative" not in section:
        return {**section, "grad_clip_relative": None}
    return dict(section)


def _merge_beneath(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` with `base`'s keys added where `top` lacks them (nested mappings merged the same way)."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge_beneath(below, value)
        else:
            merged[key] = value
    return merged


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dicts of a dataclass config, ready for YAML or JSON."""
    return dataclasses.asdict(config)


def config_to_yaml(config: Any) -> str:
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)


def save_config(config: Any, path: str | Path) -> None:
    """Write the resolved config beside an artifact, atomically."""
    atomic_write_text(path, config_to_yaml(config))


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain config dicts."""
    keys = sorted(set(a) | set(b))
    differences = []
    for key in keys:
        dotted = f"{prefix}{key}"
        left, right = a.get(key, "<missing>"), b.get(key, "<missing>")
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            differences.extend(config_differences(left, right, f"{dotted}."))
        elif left != right:
            differences.append(f"{dotted}: {left!r} != {right!r}")
    return differences


def resolve_device(name: str) -> str:
    """`auto` -> `cuda` when available, else `cpu`; anything else is returned as given."""
    import torch  # lazy: the config is read by commands that run without PyTorch (`dynaforge rollout`)

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def _build(cls: type, data: Any, path: str, default: Any = None) -> Any:
    """Instantiate dataclass `cls` from `data`; keys absent from `data` come from `default` (an instance)."""
    if cls is Range and isinstance(data, int | float) and not isinstance(data, bool):
        return Range(float(data), float(data))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path)} must be a mapping of keys to values, got {data!r}")
    if cls is SystemConfig or (isinstance(cls, type) and issubclass(cls, SystemConfig) and "name" in data):
        cls = _system_class(data, path)
    elif cls is ModelConfig or (isinstance(cls, type) and issubclass(cls, ModelConfig) and "name" in data):
        cls = _model_class(data, path)
    if default is not None and type(default) is not cls:
        default = None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(_unknown_key_message(str(key), names, path))
        field_default = _field_default(cls, key) if default is None else getattr(default, key)
        kwargs[key] = _convert(hints[key], value, _join(path, key), field_default)
    if default is not None:
        for name in names:
            kwargs.setdefault(name, getattr(default, name))
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{_where(path)} is missing required key(s): {', '.join(missing)}")
    check_fields(cls, kwargs, path)  # each value against its declared range, named by its dotted key
    try:
        return cls(**kwargs)
    except ConfigError as error:
        raise ConfigError(f"{_where(path)}: {error}") from None


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


def _expand_range_shorthand(cls: type, data: Any, path: str = "") -> Any:
    """Replace numbers standing for a `Range` with {low, high} mappings, following the dataclass schema."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(cls):
        return data
    if issubclass(cls, SystemConfig):
        cls = system_config_class(data.get("name", DEFAULT_SYSTEM), _join(path, "name"))
    hints = typing.get_type_hints(cls)
    result = dict(data)
    for key, value in data.items():
        hint = hints.get(key)
        if SystemConfig in typing.get_args(hint):  # `system` (SystemConfig | NBodyConfig): chosen by name
            hint = SystemConfig
        if hint is Range and isinstance(value, int | float) and not isinstance(value, bool):
            result[key] = {"low": float(value), "high": float(value)}
        elif dataclasses.is_dataclass(hint):
            result[key] = _expand_range_shorthand(hint, value, _join(path, key))
    return result


def _system_class(data: Mapping[str, Any], path: str) -> type[SystemConfig] | type[NBodyConfig]:
    return system_config_class(data.get("name", DEFAULT_SYSTEM), _join(path, "name"))


def _model_class(data: Mapping[str, Any], path: str) -> type[ModelConfig]:
    name = data.get("name", "fno")
    if name not in MODEL_CONFIGS:
        valid = ", ".join(sorted(MODEL_CONFIGS))
        raise ConfigError(f"unknown model {_join(path, 'name')}={name!r}; valid models: {valid}")
    return MODEL_CONFIGS[name]


def _convert(hint: Any, value: Any, path: str, default: Any = None) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if SystemConfig in options:  # the system section picks its dataclass by `name` (see _build)
            return _build(SystemConfig, value, path, default if dataclasses.is_dataclass(default) else None)
        errors = []
        for option in options:
            try:
                return _convert(option, value, path)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: no option fits {value!r}: {errors}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}={value!r} is not valid; choose one of: {', '.join(map(str, args))}")
        return value
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping, got {value!r}")
        key_type, value_type = args
        return {
            _convert(key_type, k, f"{path}.{k}"): _convert(value_type, v, f"{path}.{k}")
            for k, v in value.items()
        }
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        item_type = args[0] if args else Any
        items = [_convert(item_type, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, default if dataclasses.is_dataclass(default) else None)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}={value!r}: must be a finite number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported config type {hint!r}")


def _unknown_key_message(key: str, valid: Sequence[str], path: str) -> str:
    dotted = _join(path, key)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" Did you mean '{_join(path, close[0])}'?" if close else ""
    return f"unknown config key '{dotted}'.{hint} Valid keys under {_where(path)}: {', '.join(valid)}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _where(path: str) -> str:
    return f"'{path}'" if path else "the top level"
