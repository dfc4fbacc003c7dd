"""Typed configuration: nested dataclasses, loaded from YAML presets, overridden with dotted keys.

A preset is a small YAML file in `configs/`. On the command line, `key.sub=value` overrides any field
(`system.viscosity.low=0.005`). Values are parsed as YAML scalars. Every key is checked against the
dataclasses below: an unknown or mistyped key stops with an error that names it and lists the valid keys.

The system section is chosen by its `name` (`burgers`, `ks`, ...): each system has its own dataclass with
its own physical parameters, each a `Range` drawn per sample.

One module per component's sections (base, systems, nbody, data, models, train, evaluate, stack, tune,
two_phase) and load.py (YAML, dotted overrides, validation); every name is importable from here."""

from dynaforge.config.base import Check, ConfigError, InitialConfig, Range, check_fields, field_check
from dynaforge.config.data import DataConfig, DatasetConfig, StreamConfig
from dynaforge.config.evaluate import EvaluateConfig
from dynaforge.config.load import (
    SYSTEM_CONFIGS,
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
    AdvectionConfig,
    BurgersConfig,
    GrayScottConfig,
    HeatConfig,
    KS2DConfig,
    KSConfig,
    NavierStokesConfig,
    OperatorSpace,
    ParameterSpec,
    RandomCNNConfig,
    SystemConfig,
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
    "MODEL_CONFIGS",
    "SYSTEM_CONFIGS",
    "TRAIN_PRESETS",
    "AdvectionConfig",
    "BurgersConfig",
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
    "GrayScottConfig",
    "HeatConfig",
    "InitialConfig",
    "KS2DConfig",
    "KSConfig",
    "LatentConfig",
    "ModelConfig",
    "NBodyConfig",
    "NBodyInitialConfig",
    "NavierStokesConfig",
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
    "config_differences",
    "config_from_dict",
    "config_to_dict",
    "config_to_yaml",
    "field_check",
    "load_config",
    "resolve_device",
    "save_config",
]
