"""`dynaforge evaluate STACK` on a staged latent stack (tiny preset): the report shows the
predictor-corrector rollouts (operator alone, S-step corrector, distilled student), the ensembles' spread
against their error with the spread-error correlation, and the steady prior's score."""

import json
import math
from pathlib import Path

import pytest

from dynaforge.config import load_config
from dynaforge.evaluate import evaluate
from dynaforge.evaluate.stack_report import long_horizon_spectrum_error
from dynaforge.metrics.spectra import spectrum_distance
from dynaforge.train.stages import run_stages
from tests.conftest import CONFIGS

FAST = [
    "stages.operator.epochs=1",
    "stages.diffusion_residual.epochs=1",
    "stages.diffusion_residual.interval=2",
    "stages.consistency_distill.epochs=1",
    "stages.consistency_distill.temperature=0.5",
    "stages.steady_prior.epochs=1",
    "evaluate.rollout_frames=6",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from dynaforge.generate import generate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("stack-report")
        config = load_config(CONFIGS / "tiny-latent.yaml", FAST)
        generate(config, root / "data", progress=False)
        run_stages(config, root / "data", root / "run", progress=False)
        run_stages(config, root / "data", root / "run", stage="steady_prior", progress=False)  # opt-in
    finally:
        torch.set_num_threads(threads)
    return root / "run"


def test_evaluating_a_stack_reports_rollouts_ensembles_and_prior(stack: Path, one_thread: None) -> None:
    result = evaluate(stack)
    assert result.report == stack / "eval" / "report.html"
    section = result.metrics["latent_stack"]
    rollouts = section["rollouts"]
    assert list(rollouts) == ["operator", "corrector", "student"]
    assert all(len(row["nrmse_per_step"]) == section["steps"] == 6 for row in rollouts.values())
    # the operator-alone variant is the rollout the usual sections score
    assert rollouts["operator"]["nrmse_per_step"] == pytest.approx(result.metrics["rollout_nrmse"], rel=1e-5)
    # cost in network calls: S = 4 every 2 steps, the 1-step student every 2 steps
    assert rollouts["corrector"]["network_calls_per_step"] == 2.0
    assert rollouts["student"]["network_calls_per_step"] == 0.5
    # teacher and student compared at the temperature the student was distilled at
    assert rollouts["corrector"]["temperature"] == rollouts["student"]["temperature"] == 0.5
    ensembles = result.metrics["ensembles"]
    assert ensembles["members"] == 4 and list(ensembles["variants"]) == ["corrector", "student"]
    for name in ("corrector", "student"):
        ensemble = ensembles["variants"][name]
        assert -1.0 <= ensemble["spread_error_correlation"] <= 1.0
        # no correction before step k = 2, then members differ (the corrector is stochastic)
        assert ensemble["spread_per_step"][0] == 0 and min(ensemble["spread_per_step"][1:]) > 0
        # so the ratio is 0 at step 1 and positive after; the spread is the same (0) for every trajectory
        # at step 1, where the correlation across trajectories is undefined
        ratios = ensemble["spread_skill_per_step"]
        assert len(ratios) == 6 and ratios[0] == 0 and min(ratios[1:]) > 0
        assert ensemble["correlation_per_step"][0] is None
        assert ensemble["spread_skill_ratio"] > 0
    steady = section["steady_prior"]
    assert steady["prior"] > 0 and steady["baseline"] > 0 and steady["samples"] == 4 * 3
    html = result.report.read_text()
    for text in (
        "Latent stack: predictor-corrector rollouts and ensembles",
        "operator alone",
        "S-step corrector (4 step(s), every 2 step(s), temperature 0.5)",
        "distilled student (1 step(s), every 2 step(s), temperature 0.5)",
        "Ensembles: spread against error",
        "spread-error correlation",
        "spread-skill ratio",
        "Ensemble spread and the error of the ensemble mean against rollout time",
        "Steady prior",
    ):
        assert text in html, text
    assert (stack / "eval" / "stack_rollouts.png").exists()
    assert (stack / "eval" / "ensemble_spread_error.png").exists()
    saved = json.loads((stack / "eval" / "metrics.json").read_text())
    assert saved["ensembles"]["variants"]["corrector"]["label"] in html


def test_spectrum_distance_counts_energetic_shells_only() -> None:
    import torch

    e_true = torch.tensor([5.0, 1.0, 0.1, 1e-12], dtype=torch.float64)
    e_pred = torch.tensor([0.0, 10.0, 0.01, 1.0], dtype=torch.float64)
    # shell 0 and the shell below 1e-6 of the peak are left out: mean of |log10 10| and |log10 0.1|
    assert spectrum_distance(e_pred, e_true) == pytest.approx(1.0)
    x = torch.linspace(0, 2 * math.pi, 33, dtype=torch.float32)[:-1]
    fields = torch.sin(3 * x).expand(2, 4, 1, 32)
    assert long_horizon_spectrum_error(fields, fields) == pytest.approx(0.0, abs=1e-6)
    assert long_horizon_spectrum_error(2 * fields, fields) == pytest.approx(math.log10(4), rel=1e-5)


def test_dynaforge_run_with_stage_all_trains_and_reports_the_stack(tmp_path: Path, one_thread: None) -> None:
    from dynaforge.cli import main

    overrides = [
        *FAST,
        "dataset.n_train=4",
        "stages.val_windows=8",
        "evaluate.rollout_frames=4",
        "evaluate.worst_samples=1",
        "evaluate.plot_samples=1",
    ]
    command = [
        "-q",
        "run",
        str(CONFIGS / "tiny-latent.yaml"),
        "stage=all",
        *overrides,
        "--out",
        str(tmp_path),
    ]
    assert main([*command, "--no-progress"]) == 0
    status = json.loads((tmp_path / "run" / "stages.json").read_text())
    assert list(status["stages"]) == ["operator", "diffusion_residual", "consistency_distill"]
    assert all(record["status"] == "done" for record in status["stages"].values())
    html = (tmp_path / "run" / "eval" / "report.html").read_text()
    assert "Latent stack: predictor-corrector rollouts and ensembles" in html
    assert "Ensembles: spread against error" in html
    assert "No steady prior in this stack" in html  # opt-in: stage=all leaves it out
