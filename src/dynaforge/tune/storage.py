"""Where a study lives: its storage URL, the password rule, and the locks that let processes share it.

The database is the study: trials, their values, states and heartbeats. Processes on several machines
share a study by sharing a database server (`--storage postgresql://USER@HOST:PORT/DB`); each machine then
keeps its own study folder (config.yaml, data/, the run folders of the trials it ran, and summary, plots
and best/ drawn from the whole study), unless the folders are one shared file system.

A password never goes into the URL: the URL is saved with the config and written to logs, W&B and the
study folder. libpq (under psycopg) reads it from PGPASSWORD or the password file (~/.pgpass, PGPASSFILE).

Two locks keep processes in step. `setup`: one process at a time checks the config, makes the dataset and
creates the database's tables (neither SQLite nor PostgreSQL accept two processes creating them at once).
`claim`: one process at a time counts the study's finished and running trials and, if fewer than asked,
starts one, so that the study ends with exactly the trials asked for. On PostgreSQL both are advisory locks
of the database, held across machines; otherwise they are lock files in the study folder (one machine).
"""

from __future__ import annotations

import fcntl
import hashlib
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from dynaforge.config import ConfigError

PASSWORD_FIX = "put the password in PGPASSWORD or ~/.pgpass (PGPASSFILE), not in the URL"


def check_storage_url(url: str) -> None:
    """Refuse a storage URL that is not one, or that carries a password (it would be written everywhere)."""
    try:
        parsed = make_url(url)
    except ArgumentError as error:
        raise ConfigError(
            f"storage {url!r} is not a database URL ({error}); e.g. postgresql://USER@HOST:PORT/DB"
        ) from None
    if parsed.password is not None:
        raise ConfigError(
            f"storage {parsed.render_as_string(hide_password=True)} carries a password; {PASSWORD_FIX}"
        )


def is_postgresql(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


class StudyLock:
    """A lock held by one process of study `study` at a time (`purpose`: setup or claim); see the module.

    A context manager; `release()` may also be called inside it (the claim is released as soon as the
    trial it let start is in the database).
    """

    def __init__(self, url: str, root: Path, study: str, purpose: str) -> None:
        self.url = url
        self.path = root / f".{purpose}.lock"
        # pg_advisory_lock takes a signed 64-bit key: this study's and purpose's.
        digest = hashlib.sha256(f"dynaforge tune:{study}:{purpose}".encode()).digest()
        self.key = int.from_bytes(digest[:8], "big", signed=True)
        self.connection: Connection | None = None
        self.file: IO[str] | None = None

    def acquire(self) -> None:
        if is_postgresql(self.url):
            engine = create_engine(self.url, poolclass=NullPool)
            self.connection = engine.connect()
            self.connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self.key})
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a")  # noqa: SIM115 (closed by release)
            fcntl.flock(self.file, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.connection is not None:
            # Closing the session releases its advisory locks (also when the process dies holding one).
            self.connection.close()
            self.connection.engine.dispose()
            self.connection = None
        if self.file is not None:
            self.file.close()  # releases the flock
            self.file = None

    def __enter__(self) -> StudyLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def engine_kwargs(url: str) -> dict[str, Any] | None:
    """SQLAlchemy engine options of the study's storage: SQLite waits for a lock rather than failing."""
    return {"connect_args": {"timeout": 60}} if make_url(url).get_backend_name() == "sqlite" else None
