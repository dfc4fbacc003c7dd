"""Run-config comparison: what makes a saved run resumable with a given config."""

from __future__ import annotations

from dynaforge.config import config_to_dict, load_config
from dynaforge.runs import training_differences


def test_run_saved_before_a_config_section_existed_matches_its_defaults() -> None:
    wanted = config_to_dict(load_config("configs/tiny.yaml"))
    saved = {key: value for key, value in wanted.items() if key != "twophase"}
    assert training_differences(saved, wanted) == []


def test_a_changed_training_key_is_reported_and_an_evaluation_key_is_not() -> None:
    wanted = config_to_dict(load_config("configs/tiny.yaml"))
    saved = config_to_dict(load_config("configs/tiny.yaml"))
    saved["train"]["lr"] = wanted["train"]["lr"] * 2
    saved["evaluate"] = {**saved["evaluate"], "rollout_frames": saved["evaluate"]["rollout_frames"] + 1}
    differences = training_differences(saved, wanted)
    assert len(differences) == 1 and differences[0].startswith("train.lr:")


def test_a_saved_key_that_no_longer_exists_is_reported_by_name() -> None:
    wanted = config_to_dict(load_config("configs/tiny.yaml"))
    saved = {**wanted, "retired_section": {"x": 1}}
    assert any(d.startswith("retired_section") for d in training_differences(saved, wanted))


def test_the_search_space_of_a_study_is_not_part_of_the_run() -> None:
    wanted = config_to_dict(load_config("configs/tiny-tune.yaml"))
    saved = config_to_dict(load_config("configs/tiny-tune.yaml"))
    saved["tune"]["seed"] = wanted["tune"]["seed"] + 3
    assert training_differences(saved, wanted) == []
