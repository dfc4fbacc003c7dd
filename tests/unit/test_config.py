"""Config loading: presets, dotted overrides, and errors that name the key and the valid ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynaforge.config import (
    ConfigError,
    Range,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from dynaforge.systems.pde.burgers import BurgersConfig
from dynaforge.systems.pde.ks import KSConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("preset", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_preset_loads(preset: str) -> None:
    load_config(CONFIGS / preset)


def test_dotted_override_of_a_range_bound() -> None:
    config = load_config(CONFIGS / "burgers1d.yaml", ["system.viscosity.low=0.005", "dataset.n_train=3"])
    assert isinstance(config.system, BurgersConfig)
    assert config.system.viscosity.low == 0.005
    assert config.dataset.n_train == 3


def test_number_means_a_constant_range_and_can_still_be_overridden_per_bound() -> None:
    config = load_config(CONFIGS / "burgers1d.yaml", ["system.domain_length.low=0.5"])
    assert config.system.domain_length == Range(0.5, 1.0)
    assert load_config(None, ["system.viscosity=0.03"]).system.viscosity == Range(0.03, 0.03)


def test_system_is_chosen_by_name_with_its_own_defaults() -> None:
    config = load_config(None, ["system.name=ks", "system.domain_length.low=50"])
    assert isinstance(config.system, KSConfig)
    assert config.system.domain_length == Range(50.0, 100.0)
    assert config.system.parameter_names() == ("domain_length",)


def test_unknown_key_names_the_key_the_closest_match_and_the_valid_keys() -> None:
    with pytest.raises(ConfigError) as error:
        load_config(CONFIGS / "burgers1d.yaml", ["system.viscosty.low=0.005"])
    message = str(error.value)
    assert "'system.viscosty'" in message
    assert "Did you mean 'system.viscosity'" in message
    assert "resolution" in message and "initial" in message


def test_unknown_top_level_key_lists_the_sections() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'foo'.*system, dataset"):
        load_config(None, ["foo=1"])


def test_parameter_of_another_system_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"'system.viscosity'.*Valid keys under 'system'"):
        load_config(None, ["system.name=ks", "system.viscosity=0.1"])


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("dataset.n_train=abc", "dataset.n_train must be an integer"),
        ("system.dtype=float16", "choose one of: float32, float64"),
        ("system.name=nope", "valid systems: advection, .*burgers, .*heat, .*ks, .*import path"),
        ("system.order=5", "order must be 1, 2, 3 or 4"),
        ("system.viscosity.low=1.0", "low .* must not exceed high"),
        ("system.save_every=3", "multiple of save_every"),
        ("no_equals_sign", "key.sub=value"),
    ],
)
def test_bad_values_are_reported_with_their_key(override: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(None, [override])


def test_missing_file_and_bad_yaml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("system: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(bad)


def test_yaml_tags_are_not_executed(tmp_path: Path) -> None:
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text("system: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError):
        load_config(hostile)


def test_saved_config_reloads_identically(tmp_path: Path) -> None:
    config = load_config(CONFIGS / "burgers1d.yaml", ["system.viscosity.high=0.03"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config
    assert config_from_dict(config_to_dict(config)) == config


def test_an_absolute_clip_alone_turns_the_relative_default_off() -> None:
    """Relative clipping is the default only where no clipping was chosen: `grad_clip` set without
    `grad_clip_relative` clips at that limit alone (so run configs written before the key resume as
    trained); both given, both apply; neither given, the relative default."""
    assert load_config(None).train.grad_clip_relative == 2.0
    alone = load_config(None, ["train.grad_clip=0.5"]).train
    assert (alone.grad_clip, alone.grad_clip_relative) == (0.5, None)
    both = load_config(None, ["train.grad_clip=0.5", "train.grad_clip_relative=3"]).train
    assert (both.grad_clip, both.grad_clip_relative) == (0.5, 3.0)
    unset = load_config(None, ["train.grad_clip=null"]).train
    assert (unset.grad_clip, unset.grad_clip_relative) == (None, 2.0)
    written_before = config_from_dict({"train": {"grad_clip": 1.0}}).train
    assert (written_before.grad_clip, written_before.grad_clip_relative) == (1.0, None)
    controller = load_config(None, ["timestepper.train.grad_clip=0.5"]).timestepper.train
    assert controller.grad_clip_relative is None


def test_the_default_loss_is_relative_l2_but_two_phase_configs_train_with_mse() -> None:
    """relative_l2 is the window engine's default; a hand-written config with a `twophase` section and no
    `train.loss` gets mse (the only loss two-phase training has); a loss that is given is kept."""
    assert load_config(None).train.loss == "relative_l2"
    assert load_config(CONFIGS / "two_phase_tiny.yaml").train.loss == "mse"
    assert config_from_dict({"twophase": {}}).train.loss == "mse"
    assert config_from_dict({"twophase": {}, "train": {"loss": "relative_l2"}}).train.loss == "relative_l2"
    assert config_from_dict({"train": {"lr": 0.002}}).train.loss == "relative_l2"
