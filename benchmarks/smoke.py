"""The benchmarks' smoke mode: every benchmark script takes `--quick`, which runs its whole code path, the
baselines' included where they are cheap, at tiny sizes, and writes its outputs to a temporary folder
(`quick_path`) unless told otherwise: a smoke run is not a figure and never overwrites benchmarks/results/.

Run as a script, this module checks that every benchmark script has the flag (each script's docstring names
it and its parser defines it), then runs each with `--quick` (`--jobs` at a time) and prints the seconds each
took (`make bench-smoke`; `--check` only checks, `--list` prints the scripts). A helper module that is not a
benchmark belongs in HELPERS. Nothing here imports torch: the check runs before any environment is built.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FLAG = "--quick"
"""The smoke flag every benchmark script takes."""
HERE = Path(__file__).resolve().parent
HELPERS = ("machine.py", "literature_data.py", "smoke.py")
"""Modules of benchmarks/ that the scripts import, not benchmarks themselves."""


def quick_path(path: Path | str) -> Path:
    """Where a `--quick` run writes what a full run writes to `path`: the same name in a temporary folder."""
    folder = Path(tempfile.gettempdir()) / "dynaforge-bench-quick"
    folder.mkdir(exist_ok=True)
    return folder / Path(path).name


def benchmark_scripts() -> list[Path]:
    """Every benchmark script: the modules of benchmarks/ but the HELPERS."""
    return sorted(p for p in HERE.glob("*.py") if p.name not in HELPERS)


def smoke_problems(script: Path) -> list[str]:
    """What keeps `script` from a smoke run: its docstring must name FLAG, its parser must define it."""
    tree = ast.parse(script.read_text(), filename=str(script))
    problems = []
    if FLAG not in (ast.get_docstring(tree) or ""):
        problems.append(f"its docstring does not document {FLAG}")
    defines = any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        and any(isinstance(a, ast.Constant) and a.value == FLAG for a in node.args)
        for node in ast.walk(tree)
    )
    if not defines:
        problems.append(f"its argument parser has no {FLAG}")
    return problems


def check(scripts: list[Path]) -> bool:
    """Prints each script's problems; True when there are none."""
    clean = True
    for script in scripts:
        for problem in smoke_problems(script):
            clean = False
            print(
                f"benchmarks/{script.name}: {problem} (every benchmark needs a {FLAG} smoke mode: tiny sizes, "
                "outputs to smoke.quick_path; a helper module belongs in smoke.HELPERS)"
            )
    return clean


def run_one(script: Path, jobs: int) -> tuple[int, float]:
    """Runs `script` with FLAG: its exit status and seconds. With several jobs its output is printed whole
    when it ends (not interleaved with the others')."""
    started = time.perf_counter()
    command = [sys.executable, str(script), FLAG]
    if jobs == 1:
        print(f"== {script.name} {FLAG}", flush=True)
        code = subprocess.run(command, cwd=HERE.parent, check=False).returncode
    else:
        result = subprocess.run(command, cwd=HERE.parent, check=False, capture_output=True, text=True)
        print(f"== {script.name} {FLAG}\n{result.stdout}{result.stderr}", end="", flush=True)
        code = result.returncode
    if code != 0:
        print(f"== {script.name} {FLAG} FAILED (exit {code})", flush=True)
    return code, time.perf_counter() - started


def run_all(scripts: list[Path], jobs: int = 1) -> bool:
    """Runs each script with FLAG, `jobs` at a time (all of them, even after a failure); prints the seconds
    of each (measured side by side when jobs > 1: smoke runs are not figures) and the wall time."""
    started = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        outcomes = dict(zip(scripts, pool.map(lambda script: run_one(script, jobs), scripts), strict=True))
    failed = [script.name for script, (code, _) in outcomes.items() if code != 0]
    print(f"\n{'script':<26}{'seconds':>8}")
    for script, (_, took) in outcomes.items():
        print(f"{script.name:<26}{took:>8.1f}{'  FAILED' if script.name in failed else ''}")
    print(f"{'sum':<26}{sum(took for _, took in outcomes.values()):>8.1f}")
    print(f"{f'wall ({jobs} at a time)':<26}{time.perf_counter() - started:>8.1f}")
    if failed:
        print(f"smoke runs failed: {', '.join(failed)}")
    return not failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that every script has the flag")
    parser.add_argument("--list", action="store_true", help="print the benchmark scripts and stop")
    parser.add_argument("--jobs", type=int, default=1, help="scripts run side by side (default 1)")
    parser.add_argument("scripts", nargs="*", help="script names to run (default: every benchmark)")
    args = parser.parse_args()
    scripts = benchmark_scripts()
    if args.scripts:
        unknown = sorted(set(args.scripts) - {p.name for p in scripts})
        if unknown:
            parser.error(f"not benchmark scripts: {', '.join(unknown)}")
        scripts = [p for p in scripts if p.name in args.scripts]
    if args.list:
        print("\n".join(f"benchmarks/{p.name}" for p in scripts))
        return 0
    if not check(scripts):
        return 1
    if args.check:
        print(f"every benchmark script has {FLAG}: {', '.join(p.name for p in scripts)}")
        return 0
    return 0 if run_all(scripts, args.jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
