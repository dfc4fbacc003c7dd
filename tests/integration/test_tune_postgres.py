"""`dynaforge tune --storage postgresql://...`: two processes share one study on a real PostgreSQL server,
run exactly the trials asked for, and write its password nowhere."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
pytest.importorskip("psycopg", reason="the PostgreSQL driver (the `postgres` extra) is not installed")

import sqlalchemy  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from dynaforge.cli import main  # noqa: E402
from tests.conftest import CONFIGS  # noqa: E402
from tests.integration.test_tune import SPACE, write_config  # noqa: E402

USER = "tuner"


def server_binaries() -> Path | None:
    """The folder holding initdb, pg_ctl and postgres (PATH first, then Debian's /usr/lib/postgresql)."""
    candidates = [
        shutil.which("initdb"),
        *sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True),
    ]
    for initdb in filter(None, candidates):
        folder = Path(initdb).resolve().parent
        if (folder / "pg_ctl").exists() and (folder / "postgres").exists():
            return folder
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: there, run its programs as `nobody` (runuser, from util-linux)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "nobody", "--", *command]


class Server:
    def __init__(self, root: Path, port: int, password: str) -> None:
        self.root, self.port, self.password = root, port, password
        self.url = f"postgresql://{USER}@127.0.0.1:{port}/postgres"


@pytest.fixture
def postgres() -> Iterator[Server]:
    """A PostgreSQL server in a temporary folder, listening on 127.0.0.1 only, password (SCRAM) logins."""
    binaries = server_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql")
    # Not under pytest's tmp_path: its parents are private to this user, and the server may run as nobody.
    root = Path(tempfile.mkdtemp(prefix="dynaforge-pg-"))
    root.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "nobody")
    password = secrets.token_hex(16)
    password_file = root / "password"
    password_file.write_text(password + "\n")
    if os.geteuid() == 0:
        shutil.chown(password_file, "nobody")
    data = root / "data"
    server = Server(root, free_port(), password)

    def run(*command: str) -> None:
        done = subprocess.run(as_server_user(list(command)), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command[0]} failed:\n{done.stdout}\n{done.stderr}"

    try:
        run(
            str(binaries / "initdb"),
            "-D", str(data), "-U", USER, "--auth=scram-sha-256", f"--pwfile={password_file}",
            "--no-sync", "--encoding=UTF8", "--no-locale",
        )  # fmt: skip
        password_file.unlink()
        options = f"-c listen_addresses=127.0.0.1 -p {server.port} -k {root} -c fsync=off"
        run(
            str(binaries / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "server.log"),
            "-o",
            options,
            "-w",
            "start",
        )
        yield server
    finally:
        if (data / "postmaster.pid").exists():
            run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)


def files_under(*folders: Path) -> list[Path]:
    return [path for folder in folders for path in folder.rglob("*") if path.is_file()]


def first_trial_started(url: str, password: str, timeout: float = 120.0) -> None:
    """Wait until the study holds a trial whose objective has begun (its `pid` attribute is set: the
    process has released its claim lock by then, see `tune.study.run_trials`). Plain SQL on Optuna's
    tables: an Optuna storage here would create the tables while the tune process does (which PostgreSQL
    refuses)."""
    engine = sqlalchemy.create_engine(url, connect_args={"password": password}, poolclass=NullPool)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with engine.connect() as connection:
                if connection.execute(
                    sqlalchemy.text("SELECT to_regclass('trial_user_attributes')")
                ).scalar():
                    query = "SELECT count(*) FROM trial_user_attributes WHERE key = 'pid'"
                    if connection.execute(sqlalchemy.text(query)).scalar():
                        return
            time.sleep(0.05)
    finally:
        engine.dispose()
    raise AssertionError(f"no trial started within {timeout:g} s")


@pytest.mark.slow
def test_two_processes_share_a_postgresql_study(tmp_path: Path, tiny_data: Path, postgres: Server) -> None:
    # Heartbeats every 60 s: the first process is paused below, and must not look dead meanwhile.
    config = write_config(
        tmp_path / "pg.yaml",
        CONFIGS / "tiny.yaml",
        {"train": {"epochs": 1, "device": "cpu"}},
        {"space": SPACE, "plots": False, "pruner": {"name": "none"}, "heartbeat": 60},
    )
    trials = 4
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PGPASSWORD": postgres.password,
        "PGPASSFILE": str(tmp_path / "no-pgpass"),  # the test's password alone, not the user's ~/.pgpass
    }
    # One study folder per process, as on two machines: the database alone is shared.
    folders = [tmp_path / f"machine{i}" for i in range(2)]
    outputs = [tmp_path / f"machine{i}.out" for i in range(2)]

    def start(folder: Path, output: Path) -> subprocess.Popen:
        args = ["tune", str(config), "--trials", str(trials), "--out", str(folder), "--data", str(tiny_data)]
        with open(output, "w") as stream:
            return subprocess.Popen(
                [sys.executable, "-m", "dynaforge.cli", *args, "--storage", postgres.url],
                env=env,
                stdout=stream,
                stderr=subprocess.STDOUT,
                text=True,
            )

    # Deterministic interleaving (a race left to the scheduler made the second process sometimes arrive
    # after the first had run every trial): the first process is paused inside its first trial, the second
    # runs while that trial is RUNNING (and must count it), then the first finishes it and finds the study
    # complete.
    started = time.monotonic()
    processes = [start(folders[0], outputs[0])]
    try:
        first_trial_started(postgres.url, postgres.password)
        processes[0].send_signal(signal.SIGSTOP)
        processes.append(start(folders[1], outputs[1]))
        processes[1].wait(timeout=180)
        assert processes[1].returncode == 0, outputs[1].read_text()
        processes[0].send_signal(signal.SIGCONT)
        processes[0].wait(timeout=180)
        assert processes[0].returncode == 0, outputs[0].read_text()
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
    print(f"two tune processes: {time.monotonic() - started:.1f} s")

    storage = optuna.storages.RDBStorage(
        postgres.url, engine_kwargs={"connect_args": {"password": postgres.password}}
    )
    try:
        study = optuna.load_study(study_name="pg", storage=storage)
        trials_run, attrs = study.trials, study.user_attrs
    finally:
        storage.engine.dispose()  # close its connections before the server stops
    numbers = [t.number for t in trials_run]
    assert len(numbers) == len(set(numbers))
    assert [t.state for t in trials_run] == [optuna.trial.TrialState.COMPLETE] * trials
    assert attrs["processes"] == 2
    pids = [t.user_attrs["pid"] for t in trials_run]
    # The paused process ran trial 0 alone; the second ran the other three while trial 0 was RUNNING.
    assert pids[0] == processes[0].pid and pids[1:] == [processes[1].pid] * (trials - 1)
    # Each trial ran once, in one of the two study folders.
    runs = sorted(str(run.relative_to(folder)) for folder in folders for run in (folder / "trials").glob("*"))
    assert runs == sorted(t.user_attrs["run"] for t in trials_run)
    assert len(runs) == len(set(runs)) == trials

    written = files_under(*folders) + outputs
    assert any(path.name == "summary.json" for path in written)
    leaks = [str(path) for path in written if postgres.password.encode() in path.read_bytes()]
    assert not leaks, f"the database password was written to {leaks}"


def test_a_password_in_the_storage_url_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "c.yaml", CONFIGS / "tiny.yaml", {}, {"space": SPACE})
    url = "postgresql://tuner:hunter2@db.example:5432/studies"
    assert main(["tune", str(config), "--trials", "1", "--out", str(tmp_path / "s"), "--storage", url]) != 0
    error = capsys.readouterr().err
    assert error.count("error:") == 1 and "PGPASSWORD or ~/.pgpass" in error and "hunter2" not in error
    assert not (tmp_path / "s").exists()
    config = write_config(tmp_path / "d.yaml", CONFIGS / "tiny.yaml", {}, {"space": SPACE, "storage": url})
    assert main(["tune", str(config), "--trials", "1", "--out", str(tmp_path / "s")]) != 0
    error = capsys.readouterr().err
    assert "PGPASSWORD or ~/.pgpass" in error and "hunter2" not in error
