"""The evaluation report: one self-contained HTML file (figures embedded as base64 PNG), readable offline."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any


def png_to_img(png: bytes, alt: str) -> str:
    encoded = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def metrics_table(metrics: Mapping[str, Any]) -> str:
    rows = [
        ("one-step nRMSE", f"{metrics['one_step_nrmse']:.4e}"),
        (f"rollout nRMSE, step 1 of {metrics['rollout_frames']}", f"{metrics['rollout_nrmse'][0]:.4e}"),
        (f"rollout nRMSE, step {metrics['rollout_frames']}", f"{metrics['rollout_nrmse'][-1]:.4e}"),
        ("rollout nRMSE, mean over steps", f"{metrics['rollout_nrmse_mean']:.4e}"),
        ("test trajectories", str(metrics["test_samples"])),
        ("one-step windows", str(metrics["one_step_windows"])),
        ("checkpoint", f"{metrics['checkpoint']} (epoch {metrics['checkpoint_epoch']})"),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def render_report(
    title: str,
    metrics: Mapping[str, Any],
    figures: Sequence[tuple[str, bytes]],
    config_yaml: str,
    training: Mapping[str, Any],
) -> str:
    """The HTML page: metrics, figures (caption, PNG bytes), training summary and the run's config."""
    figure_html = "".join(
        f"<figure>{png_to_img(png, caption)}<figcaption>{html.escape(caption)}</figcaption></figure>"
        for caption, png in figures
    )
    per_step = ", ".join(f"{v:.3e}" for v in metrics["rollout_nrmse"])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 1250px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }}
th {{ background: #f4f4f4; font-weight: normal; }}
figure {{ margin: 1.5em 0; }}
img {{ max-width: 100%; }}
pre {{ background: #f7f7f7; padding: 1em; overflow-x: auto; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>Errors are relative L2 norms (nRMSE) per test trajectory and frame, in physical units, averaged over
trajectories. Only predicted frames are scored; the true input frames never are.</p>
<h2>Metrics</h2>
{metrics_table(metrics)}
<p>Rollout nRMSE per step: {html.escape(per_step)}</p>
<h2>Figures</h2>
{figure_html}
<h2>Training</h2>
<pre>{html.escape(json.dumps(dict(training), indent=2))}</pre>
<h2>Configuration</h2>
<pre>{html.escape(config_yaml)}</pre>
</body>
</html>
"""
