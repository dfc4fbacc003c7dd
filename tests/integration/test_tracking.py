"""W&B tracking for tune trials and checkpoints: trials grouped by study, checkpoints logged as artifacts,
a run resumed from one. W&B itself is an optional extra: these tests use a stand-in module recording
what dynaforge asks of it (no network, no key), except the last, which runs the real package offline when
it is installed and is skipped otherwise."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.errors import RunError
from dynaforge.runs import load_checkpoint
from dynaforge.train import train
from dynaforge.train.log import ARTIFACT_FILE, start_from_artifact
from tests.conftest import CONFIGS

TINY = CONFIGS / "tiny.yaml"


class FakeArtifact:
    def __init__(self, name: str, type: str, metadata: dict[str, Any]) -> None:
        self.name, self.type, self.metadata = name, type, metadata
        self.files: dict[str, bytes] = {}

    def add_file(self, path: str, name: str) -> None:
        self.files[name] = Path(path).read_bytes()


class FakeRun:
    def __init__(self, store: dict[str, FakeArtifact], **kwargs: Any) -> None:
        self.kwargs, self.store = kwargs, store
        self.id = kwargs.get("id") or f"run{len(store)}{id(self) % 1000}"
        self.logged_artifacts: list[tuple[FakeArtifact, list[str]]] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        pass

    def log_artifact(self, artifact: FakeArtifact, aliases: list[str]) -> None:
        self.logged_artifacts.append((artifact, aliases))
        for alias in aliases:
            self.store[f"{artifact.name}:{alias}"] = artifact

    def finish(self) -> None:
        pass


class FakeApi:
    def __init__(self, store: dict[str, FakeArtifact]) -> None:
        self.store = store

    def artifact(self, reference: str, type: str) -> Any:
        stored = self.store[reference.split("/")[-1]]
        assert type == stored.type == "model"

        class Download:
            def download(self, root: str) -> str:
                for name, data in stored.files.items():
                    (Path(root) / name).write_bytes(data)
                return root

        return Download()


@pytest.fixture
def fake_wandb(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[list[FakeRun], dict[str, FakeArtifact]]:
    runs: list[FakeRun] = []
    store: dict[str, FakeArtifact] = {}
    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: runs.append(FakeRun(store, **kwargs)) or runs[-1]  # type: ignore[attr-defined]
    module.Artifact = FakeArtifact  # type: ignore[attr-defined]
    module.Api = lambda: FakeApi(store)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key configured
    return runs, store


def test_checkpoints_are_logged_as_artifacts_and_a_run_resumes_from_one(
    tiny_data: Path,
    tmp_path: Path,
    fake_wandb: tuple[list[FakeRun], dict[str, FakeArtifact]],
    one_thread: None,
) -> None:
    runs, _ = fake_wandb
    overrides = ["train.wandb.enabled=true", "train.wandb.log_checkpoints=true", "train.device=cpu"]
    train(load_config(TINY, [*overrides, "train.epochs=2"]), tiny_data, tmp_path / "run", progress=False)
    (run,) = runs
    assert run.kwargs["mode"] == "offline"
    logged = [(artifact.type, aliases) for artifact, aliases in run.logged_artifacts]
    assert [aliases[:2] for _, aliases in logged] == [["latest", "epoch-1"], ["latest", "epoch-2"]]
    assert all(kind == "model" for kind, _ in logged)
    last = run.logged_artifacts[-1][0]
    assert last.files[ARTIFACT_FILE] == (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes()
    assert last.metadata["epoch"] == 2

    # Continue on "another machine" from the epoch-1 artifact: epoch 2 is trained again there.
    reference = f"me/dynaforge/checkpoint-{run.id}:epoch-1"
    more = load_config(TINY, [*overrides, "train.epochs=2"])
    out = tmp_path / "continued"
    code = main(
        ["-q", "train", str(TINY), *overrides, "train.epochs=2", "--data", str(tiny_data), "--out", str(out),
         "--resume-from-artifact", reference, "--no-progress"]
    )  # fmt: skip
    assert code == 0
    records = (out / "metrics.jsonl").read_text()
    assert '"kind": "resume"' in records and '"epoch": 2' in records
    assert load_checkpoint(out / "checkpoints" / "last.pt")["epoch"] == 2
    assert load_config(out / "config.yaml") == more

    # An artifact of another config is refused, and nothing is left behind.
    with pytest.raises(RunError, match=r"(?s)different config.*train\.lr: 0\.01 != 0\.5"):
        start_from_artifact(reference, tmp_path / "other", load_config(TINY, [*overrides, "train.lr=0.5"]))
    assert not (tmp_path / "other" / "checkpoints" / "last.pt").exists()


def test_tune_trials_are_grouped_by_study_in_wandb(
    tiny_data: Path,
    tmp_path: Path,
    fake_wandb: tuple[list[FakeRun], dict[str, FakeArtifact]],
    one_thread: None,
) -> None:
    pytest.importorskip("optuna")
    runs, _ = fake_wandb
    data = yaml.safe_load(TINY.read_text())
    data["train"].update({"epochs": 1, "device": "cpu", "wandb": {"enabled": True}})
    data["tune"] = {"space": {"train.lr": {"kind": "log_uniform", "low": 1e-3, "high": 1e-2}}, "plots": False}
    config = tmp_path / "tracked.yaml"
    config.write_text(yaml.safe_dump(data))
    args = ["-q", "tune", str(config), "--trials", "2", "--study", "s1", "--out", str(tmp_path / "study")]
    assert main([*args, "--data", str(tiny_data)]) == 0
    assert [run.kwargs["group"] for run in runs] == ["s1", "s1"]
    assert [run.kwargs["name"] for run in runs] == ["s1-trial-0000", "s1-trial-0001"]
    assert all(run.kwargs["mode"] == "offline" for run in runs)


def test_artifacts_need_the_wandb_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as when it is not installed
    with pytest.raises(RunError, match=r"pip install 'dynaforge\[wandb\]'"):
        start_from_artifact("me/p/checkpoint-x:latest", tmp_path / "run", load_config(TINY))


def test_real_wandb_logs_a_checkpoint_artifact_offline(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = [
        "train.epochs=1",
        "train.device=cpu",
        "train.wandb.enabled=true",
        "train.wandb.log_checkpoints=true",
    ]
    train(load_config(TINY, overrides), tiny_data, tmp_path / "run", progress=False)
    offline = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb")), "no offline run file"
    shutil.rmtree(tmp_path / "run" / "wandb")
