"""Typed configuration: nested dataclasses, loaded from YAML presets, overridden with dotted keys.

A preset is a small YAML file in `configs/`. On the command line, `key.sub=value` overrides any field
(`system.viscosity.low=0.005`). Values are parsed as YAML scalars. Every key is checked against the
dataclasses below: an unknown or mistyped key stops with an error that names it and lists the valid keys.

The system section is chosen by its `name`: each system declares its own dataclass, with its own physical
parameters (each a `Range` drawn per sample), beside its physics in `dynaforge.systems`, and
`system_config_class` finds it; a user's own system is named by import path (docs/user-systems.md).

One module per component's sections (base, systems, nbody, data, models, train, evaluate, stack, tune,
two_phase) and load.py (YAML, dotted overrides, validation); every name is importable from here."""

from dynaforge.config.base import Check, ConfigError, InitialConfig, Range, check_fields, field_check
from dynaforge.config.data import DataConfig, DatasetConfig, StreamConfig
from dynaforge.config.evaluate import EvaluateConfig
from dynaforge.config.load import (
    Config,
    apply_train_preset,
    config_differences,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_config,
    resolve_device,
    save_config,
)
from dynaforge.config.mixture import MixtureMember, check_mixture
from dynaforge.config.models import (
    MODEL_CONFIGS,
    FlowNetConfig,
    FNOConfig,
    LatentConfig,
    ModelConfig,
    UNetConfig,
)
from dynaforge.config.nbody import (
    ControllerNetConfig,
    ControllerSystemsConfig,
    NBodyConfig,
    NBodyInitialConfig,
    StepControlConfig,
    TimestepperConfig,
)
from dynaforge.config.stack import (
    CorrectorStageConfig,
    DistillStageConfig,
    OperatorStageConfig,
    StagesConfig,
    SteadyStageConfig,
)
from dynaforge.config.systems import (
    DEFAULT_SYSTEM,
    OperatorSpace,
    ParameterSpec,
    RandomCNNConfig,
    SystemConfig,
    system_config_class,
)
from dynaforge.config.train import (
    TRAIN_PRESETS,
    CompileConfig,
    CudaGraphConfig,
    EMAConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainConfig,
    WandbConfig,
)
from dynaforge.config.tune import SearchDimension, TuneConfig, TuneObjective, TunePrunerConfig
from dynaforge.config.two_phase import EnergyModelConfig, TeacherTaskConfig, TwoPhaseConfig

__all__ = [
    "DEFAULT_SYSTEM",
    "MODEL_CONFIGS",
    "TRAIN_PRESETS",
    "Check",
    "CompileConfig",
    "Config",
    "ConfigError",
    "ControllerNetConfig",
    "ControllerSystemsConfig",
    "CorrectorStageConfig",
    "CudaGraphConfig",
    "DataConfig",
    "DatasetConfig",
    "DistillStageConfig",
    "EMAConfig",
    "EnergyModelConfig",
    "EvaluateConfig",
    "FNOConfig",
    "FlowNetConfig",
    "InitialConfig",
    "LatentConfig",
    "MixtureMember",
    "ModelConfig",
    "NBodyConfig",
    "NBodyInitialConfig",
    "OperatorSpace",
    "OperatorStageConfig",
    "OptimizerConfig",
    "ParameterSpec",
    "RandomCNNConfig",
    "Range",
    "ScheduleConfig",
    "SearchDimension",
    "StagesConfig",
    "SteadyStageConfig",
    "StepControlConfig",
    "StreamConfig",
    "SystemConfig",
    "TeacherTaskConfig",
    "TimestepperConfig",
    "TrainConfig",
    "TuneConfig",
    "TuneObjective",
    "TunePrunerConfig",
    "TwoPhaseConfig",
    "UNetConfig",
    "WandbConfig",
    "apply_train_preset",
    "check_fields",
    "check_mixture",
    "config_differences",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "field_check",
    "load_config",
    "resolve_device",
    "save_config",
    "system_config_class",
]
