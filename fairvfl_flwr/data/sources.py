"""A party's own table from a file or from its database: the one source every reader of the table goes through.

A node config names its table once: ``table-path`` (CSV, or Parquet by suffix) or
``table-sql`` (a SQLAlchemy URL) with ``table-sql-query`` (a table's name or a SELECT
query). :func:`table_source` makes either a :class:`FileTable` or a :class:`SqlTable`, and
pre-flight, alignment, preparation and the kept alignment's digest read the table through
own_table.raw_table, which asks the source for its frame: a database table is checked,
aligned and prepared as a file is.

A database table is read as CSV text. Its rows stream from the database in chunks (a
server-side cursor; PostgreSQL through psycopg: ``COPY (...) TO STDOUT``, formatted by the
server), as CSV, into the pandas parser that reads a file, as the text goes past: the rows
never sit in memory twice (as the driver's rows and as the frame), and a column is a number
or a category by a file's rule. The rows come ordered by the id column: the steps of one
alignment run in separate processes and name the party's rows by position, which a file
keeps from one read to the next and a query does not promise. The table's digest, which
keys its kept alignment, is the SHA-256 of that text, so a changed row aligns again.

A node config holds no password (config/node.py refuses a URL with one):
``table-sql-password-env`` names the SuperNode's environment variable that holds it, or the
driver finds its own (PostgreSQL: ``~/.pgpass``, ``PGPASSWORD``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from fairvfl_flwr.data.partydata import PartySpec, known_digest
from fairvfl_flwr.data.tables import DataError, read_party_file

#: Rows fetched from a database at a time (the generic path; COPY streams the server's own chunks).
CHUNK = 20_000
#: Bytes of CSV text handed to the parser at a time.
BUFFER = 1 << 20
#: A table's name, optionally with its schema; anything else in table-sql-query is a query.
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?")
#: The alias of the rows a query returns, the one name the ordering refers to.
ROWS = "fairvfl_rows"


@dataclass(frozen=True)
class FileTable:
    """A table in a file: CSV, or Parquet by the ``.parquet`` suffix."""

    path: str

    @property
    def name(self) -> str:
        """The table as errors name it."""
        return self.path

    @property
    def missing(self) -> bool:
        """Whether the file is not there."""
        return not Path(self.path).is_file()

    def stamp(self, who: str) -> tuple:
        """What changes with the file (size, modification time); a missing file is refused."""
        p = Path(self.path)
        if not p.is_file():
            raise DataError(f"{who}: {p}: file not found")
        st = p.stat()
        return (st.st_size, st.st_mtime_ns)

    def read(self, who: str, id_column: str) -> tuple[Any, str]:
        """(the frame, "": a file's digest is :meth:`digest`, its bytes remembered per version)."""
        return read_party_file(self.path, f"{who}: {self.path}", id_column), ""

    def digest(self, cache: Path) -> str:
        """The file's SHA-256, hashed once per version of the file (partydata.known_digest)."""
        return known_digest(Path(self.path), cache)


@dataclass(frozen=True)
class SqlTable:
    """A table in a database: a SQLAlchemy URL without a password, the table's name or a SELECT
    query, and the environment variable that holds the password (empty: none)."""

    url: str
    query: str
    password_env: str = ""

    @property
    def name(self) -> str:
        """The table as errors name it: the URL (which holds no password) and the table or query."""
        q = " ".join(self.query.split())
        what = f"table {q}" if TABLE_NAME.fullmatch(q) else f"query {q[:60]}{'...' if len(q) > 60 else ''}"
        return f"{self.url}, {what}"

    @property
    def missing(self) -> bool:
        """False: whether a database holds the table is known only by reading it."""
        return False

    def stamp(self, who: str) -> Any:
        """What changes whenever the table may have, or None where the database offers nothing
        cheap (the table is then read again by every reader). PostgreSQL: its snapshot of
        transaction ids, which every committed write moves; SQLite: its file's size and time."""
        sa = _sqlalchemy(who)
        engine = self._engine(who)
        try:
            if engine.dialect.name == "sqlite":
                db = engine.url.database
                files = [Path(db), Path(f"{db}-wal")] if db and db != ":memory:" else []
                return tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file()) or None
            if engine.dialect.name == "postgresql":
                with engine.connect() as conn:
                    return str(conn.exec_driver_sql("SELECT pg_current_snapshot()").scalar())
        except (sa.exc.SQLAlchemyError, OSError):
            pass  # read() names the problem
        finally:
            engine.dispose()
        return None

    def read(self, who: str, id_column: str) -> tuple[Any, str]:
        """(the frame, the SHA-256 of the rows as CSV text), the rows ordered by ``id_column``
        (module doc). Refuses, naming ``who``, the URL and the database's words, a database that
        cannot be reached or a query that fails."""
        import pandas as pd

        sa = _sqlalchemy(who)
        engine = self._engine(who)
        where = f"{who}: {self.name}"
        dbapi_error = getattr(engine.dialect.loaded_dbapi, "Error", sa.exc.SQLAlchemyError)
        try:
            with engine.connect() as conn:
                # the query goes to the driver as written: a '%' in it is no placeholder
                conn = conn.execution_options(no_parameters=True)
                if engine.dialect.name == "postgresql":
                    conn = conn.execution_options(postgresql_readonly=True)
                select = self._select(conn, id_column)
                copies = engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg"
                text = _Streamed(_copied(conn, select) if copies else _fetched(conn, select))
                df = pd.read_csv(io.BufferedReader(text, BUFFER), dtype={id_column: str})
                return df, text.sha.hexdigest()
        except (sa.exc.SQLAlchemyError, dbapi_error) as exc:  # the database's words may quote a value: kept local
            raise DataError(f"{where}: cannot be read", local=f"the database said: {_said(exc)}") from None
        except ValueError as exc:  # pandas on text it cannot parse
            raise DataError(f"{where}: cannot be read as a table", local=str(exc)) from None
        finally:
            engine.dispose()

    def digest(self, cache: Path) -> str:
        """"": a database table's digest is known only by reading it (:meth:`read`)."""
        return ""

    def _engine(self, who: str) -> Any:
        sa = _sqlalchemy(who)
        try:
            url = sa.engine.make_url(self.url)
        except sa.exc.ArgumentError as exc:
            raise DataError(f"{who}: node config table-sql={self.url!r} is not a database URL ({exc})") from None
        if self.password_env:
            secret = os.environ.get(self.password_env, "")
            if not secret:
                raise DataError(f"{who}: node config table-sql-password-env={self.password_env!r}: the environment "
                                f"variable {self.password_env} is not set for this SuperNode")
            url = url.set(password=secret)
        try:
            return sa.create_engine(url, poolclass=sa.pool.NullPool)
        except (ImportError, sa.exc.NoSuchModuleError) as exc:
            raise DataError(f"{who}: node config table-sql: the database driver of {url.drivername!r} is not installed "
                            f"here ({exc}); PostgreSQL: pip install 'fairvfl-flwr[sql]'") from None

    def _select(self, conn: Any, id_column: str) -> str:
        """The query of every row, ordered by ``id_column`` when the rows hold it (when they do
        not, the frame's id check names the column, as for a file)."""
        q = self.query.strip().rstrip(";").strip()
        quote = conn.dialect.identifier_preparer.quote
        rows = (f"{'.'.join(map(quote, q.split('.')))} AS {ROWS}" if TABLE_NAME.fullmatch(q)
                else f"({q}) AS {ROWS}")
        columns = list(conn.exec_driver_sql(f"SELECT * FROM {rows} WHERE 1 = 0").keys())
        order = f" ORDER BY {ROWS}.{quote(id_column)}" if id_column in columns else ""
        return f"SELECT * FROM {rows}{order}"


def as_source(table: str | Path | FileTable | SqlTable) -> FileTable | SqlTable:
    """``table`` as a source: a path is a file's."""
    return table if isinstance(table, (FileTable, SqlTable)) else FileTable(str(Path(table).expanduser()))


def table_source(spec: PartySpec) -> FileTable | SqlTable:
    """Where a party's own table is read from: its table-path, else its table-sql. A node config
    gives one of them (config/node.py); a scoring job's alignment reads the score file as the
    party's table by putting its path in ``table_path``, whichever the training table was."""
    if spec.table_path or not spec.table_sql:
        return FileTable(spec.table_path)
    return SqlTable(spec.table_sql, spec.table_sql_query, spec.table_sql_password_env)


def _sqlalchemy(who: str) -> Any:
    try:
        import sqlalchemy
    except ImportError:
        raise DataError(f"{who}: node config table-sql needs SQLAlchemy, which is not installed here: "
                        "pip install 'fairvfl-flwr[sql]'") from None
    return sqlalchemy


def _said(exc: BaseException) -> str:
    """What the database said, without SQLAlchemy's statement and links: its first line."""
    inner = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(inner).splitlines() if line.strip()]
    return lines[0] if lines else type(inner).__name__


def _fetched(conn: Any, select: str) -> Iterator[bytes]:
    """The rows as CSV text, ``CHUNK`` rows at a time from a server-side cursor."""
    result = conn.execution_options(stream_results=True, max_row_buffer=CHUNK).exec_driver_sql(select)
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")
    out.writerow(result.keys())
    while True:
        rows = result.fetchmany(CHUNK)
        out.writerows(rows)
        yield text.getvalue().encode()
        text.seek(0)
        text.truncate()
        if not rows:
            return


def _copied(conn: Any, select: str) -> Iterator[bytes]:
    """The rows as CSV text written by PostgreSQL itself (COPY TO STDOUT through psycopg)."""
    cursor = conn.connection.driver_connection.cursor()
    pending = bytearray()
    with cursor.copy(f"COPY ({select}) TO STDOUT WITH (FORMAT csv, HEADER true)") as copy:
        for data in copy:
            pending += data
            if len(pending) >= BUFFER:
                yield bytes(pending)
                pending.clear()
    yield bytes(pending)


class _Streamed(io.RawIOBase):
    """A read-only stream over chunks of bytes that hashes them as they pass."""

    def __init__(self, parts: Iterator[bytes]) -> None:
        super().__init__()
        self._parts = parts
        self._part = memoryview(b"")
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not len(self._part):
            part = next(self._parts, None)
            if part is None:
                return 0
            self.sha.update(part)
            self._part = memoryview(part)
        n = min(len(buffer), len(self._part))
        buffer[:n] = self._part[:n]
        self._part = self._part[n:]
        return n
