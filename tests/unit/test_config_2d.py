"""Config additions of the 2D systems: ndim, the random-CNN parameter space, partial nested overrides."""

from __future__ import annotations

import pytest

from dynaforge.config import ConfigError, config_from_dict, config_to_dict, load_config


def test_ndim_is_validated_and_checked_against_the_system() -> None:
    with pytest.raises(ConfigError, match="ndim must be 1, 2 or 3"):
        load_config(None, ["system.name=heat", "system.ndim=4"])
    from dynaforge.systems import build_system

    with pytest.raises(ValueError, match=r"supports ndim in \(2,\)"):
        build_system(load_config(None, ["system.name=navier_stokes", "system.ndim=3"]).system)


def test_a_partial_override_of_a_parameter_spec_keeps_its_other_keys() -> None:
    config = load_config(None, ["system.name=random_cnn", "system.space.noise_scale.high=0.2"])
    spec = config.system.space.noise_scale
    assert (spec.kind, spec.low, spec.high, spec.log) == ("real", 1e-3, 0.2, True)
    assert config_from_dict(config_to_dict(config)) == config  # the saved config round-trips


def test_a_partial_initial_override_keeps_the_system_default_families() -> None:
    config = load_config(None, ["system.name=gray_scott", "system.initial.amplitude=0.5"])
    assert config.system.initial.families == {"blobs": 1.0} and config.system.initial.amplitude == 0.5


def test_bad_parameter_specs_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="log-scaled parameter needs low > 0"):
        load_config(None, ["system.name=random_cnn", "system.space.noise_scale.low=0.0"])
    with pytest.raises(ConfigError, match=r"unknown config key 'system\.space\.depht'"):
        load_config(None, ["system.name=random_cnn", "system.space.depht.high=4"])
    with pytest.raises(ConfigError, match="random_cnn runs in 2D only"):
        load_config(None, ["system.name=random_cnn", "system.ndim=1"])
