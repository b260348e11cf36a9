"""A real Flower federation on this machine: one SuperLink and N SuperNodes on 127.0.0.1.

Used by the deployment tests and by ``python -m fairvfl_flwr.tools.localfed`` (timing runs).
Every process is started with its own ``FLWR_HOME`` and free ports and is stopped by
:meth:`LocalFederation.stop` (also on errors: use it as a context manager). Nothing
listens on anything but the loopback address.

``flwr run`` exits 0 even when the ServerApp fails, so :meth:`LocalFederation.run`
reads the run's status back with ``flwr ls`` (``finished:completed`` is success).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from fairvfl_flwr.tools.appsource import submittable
from fairvfl_flwr.tools.cli import config_text, parse_run_config
from fairvfl_flwr.tools.flwr_engine import RunStatus, wait_finished

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on the loopback interface now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Security:
    """TLS and SuperNode authentication material (see :mod:`fairvfl_flwr.tools.tls`)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    node_keys: list[tuple[Path, Path]] = field(default_factory=list)  # (private, public) per node


class LocalFederation:
    """``flower-superlink`` + ``flower-supernode`` processes on loopback.

    Parameters
    ----------
    home : path
        Working folder: FLWR_HOME of the CLI, one sub-folder per SuperNode, logs.
    node_configs : list of mapping
        One ``--node-config`` per SuperNode.
    security : Security, optional
        Turn on TLS (all connections) and SuperNode authentication.
    env : mapping, optional
        Extra environment for every process (e.g. ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``).
    node_superlink : str, optional
        The address the SuperNodes dial instead of the SuperLink's (e.g. a WAN proxy in front
        of it, scripts/wan_proxy.py); set it before :meth:`start`. The CLI and the ServerApp
        still reach the SuperLink directly.
    node_env : mapping, optional
        Extra environment for the SuperNodes only (e.g. ``FLWR_LOG_LEVEL``, which would
        also change what the ``flwr`` CLI prints). ``PYTHONDONTWRITEBYTECODE`` is dropped
        from the SuperNodes' environment unless given here.
    """

    def __init__(
        self,
        home: Path,
        node_configs: Sequence[Mapping[str, object]],
        security: Security | None = None,
        env: Mapping[str, str] | None = None,
        node_env: Mapping[str, str] | None = None,
        node_superlink: str = "",
    ) -> None:
        self.home = Path(home).resolve()
        self.node_superlink = node_superlink
        self.node_env = dict(node_env or {})
        self.home.mkdir(parents=True, exist_ok=True)
        self.node_configs = list(node_configs)
        self.security = security
        self.port = free_port()
        self.procs: list[tuple[str, subprocess.Popen, object]] = []
        self._control: RunStatus | None = None  # made on first use (after start(): the port and certificates)
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home / "cli"),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            **(env or {}),
        }
        (self.home / "cli").mkdir(exist_ok=True)
        tls = (
            f'root-certificates = "{security.ca_cert}"\n' if security else "insecure = true\n"
        )
        (self.home / "cli" / "config.toml").write_text(
            f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "{HOST}:{self.port}"\n{tls}'
        )

    # -- processes -----------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.home / f"{name}.log", "w")
        proc = subprocess.Popen(
            cmd, env=env or self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.home,
            start_new_session=True,  # its own process group: stop() ends its children too
        )
        self.procs.append((name, proc, log))
        return proc

    def start(self, timeout: float = 60) -> "LocalFederation":
        sec = self.security
        link = [str(BIN / "flower-superlink"), "--host", HOST, "--port", str(self.port),
                "--database", ":flwr-in-memory:", "--disable-runtime-dependency-installation"]
        if sec:
            link += ["--ssl-ca-certfile", str(sec.ca_cert), "--ssl-certfile", str(sec.server_cert),
                     "--ssl-keyfile", str(sec.server_key), "--enable-supernode-auth"]
        else:
            link += ["--insecure"]
        proc = self._spawn("superlink", link)
        self._wait_port(self.port, proc, "superlink", timeout)
        if sec:
            for i, (_, public) in enumerate(sec.node_keys):
                self.flwr("supernode", "register", str(public), "local", "--name", f"party{i}")
        for i, cfg in enumerate(self.node_configs):
            node_home = self.home / f"node{i}"
            node_home.mkdir(exist_ok=True)
            cmd = [str(BIN / "flower-supernode"), "--superlink", self.node_superlink or f"{HOST}:{self.port}",
                   "--port", str(free_port()), "--node-config", config_text(cfg)]
            if sec:
                cmd += ["--root-certificates", str(sec.ca_cert), "--auth-supernode-private-key", str(sec.node_keys[i][0])]
            else:
                cmd += ["--insecure"]
            env = {**self.env, **self.node_env, "FLWR_HOME": str(node_home)}
            if "PYTHONDONTWRITEBYTECODE" not in self.node_env:
                # Python's default, as on a party's own machine: the first ClientApp process
                # caches the app's bytecode next to the installed FAB and every later one loads
                # it. Inherited from a shell or CI that sets it, every process (one per message)
                # would compile the app again (docs/deploy-time.md).
                env.pop("PYTHONDONTWRITEBYTECODE", None)
            self._spawn(f"supernode{i}", cmd, env=env)
        self.wait_nodes(len(self.node_configs), timeout)
        return self

    def _wait_port(self, port: int, proc: subprocess.Popen, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((HOST, port)) == 0:
                    return
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {self.log(name)[-3000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not open port {port} within {timeout:.0f} s")

    def wait_nodes(self, n: int, timeout: float = 60) -> None:
        """Wait until ``n`` SuperNodes are online (``flwr supernode list``)."""
        deadline = time.monotonic() + timeout
        online = 0
        while time.monotonic() < deadline:
            for name, proc, _ in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited (code {proc.returncode}): {self.log(name)[-3000:]}")
            try:
                nodes = json.loads(self.flwr("supernode", "list", "local", "--format", "json"))["nodes"]
                online = sum(str(n.get("status", "")).lower() == "online" for n in nodes)
            except (RuntimeError, KeyError, json.JSONDecodeError):
                online = 0
            if online >= n:
                return
            time.sleep(0.5)
        raise RuntimeError(f"only {online} of {n} SuperNodes came online within {timeout:.0f} s")

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Stop every process this federation started (SIGTERM, then SIGKILL), children included."""
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for _, proc, log in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the group may hold children (SuperExec, flwr-clientapp) that outlive the leader
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            log.close()
        self.procs.clear()

    def __enter__(self) -> "LocalFederation":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- the flwr CLI --------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 120, app: Path = REPO) -> str:
        out = subprocess.run(
            [str(BIN / "flwr"), *args], env=self.env, cwd=app, capture_output=True, text=True, timeout=timeout
        )
        if out.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed: {out.stdout}\n{out.stderr}")
        return out.stdout

    def submit(self, run_config: Mapping[str, object], app: Path = REPO) -> str:
        """``flwr run`` the app (its folder's source: tools/appsource.py); return the run id."""
        with submittable(app) as source:
            res = json.loads(self.flwr("run", str(source), "local", "--run-config", config_text(run_config),
                                       "--format", "json", app=source))
        if not res.get("success"):
            raise RuntimeError(f"flwr run refused the run: {res}")
        return str(res["run-id"])

    def status(self, run_id: str) -> tuple[str, bool]:
        """The run's status as ``flwr ls`` shows it (``running``, ``finished:completed``, ...),
        and whether it came from the Control API (True, :class:`RunStatus`) or from the ``flwr``
        CLI (False): a measurement would otherwise pay an interpreter per check."""
        if self._control is None:
            ca = None if self.security is None else Path(self.security.ca_cert).read_bytes()
            self._control = RunStatus(f"{HOST}:{self.port}", ca)
        if (status := self._control(run_id)) is not None:
            return status, True
        return json.loads(self.flwr("ls", "local", "--run-id", run_id, "--format", "json"))["runs"][0]["status"], False

    def wait(self, run_id: str, timeout: float = 600) -> str:
        """Wait for the run to finish; return its status (``finished:completed`` on success)."""
        return wait_finished(self.status, run_id, timeout)

    def run(self, run_config: Mapping[str, object], timeout: float = 600, app: Path = REPO) -> tuple[str, str]:
        run_id = self.submit(run_config, app)
        return run_id, self.wait(run_id, timeout)

    def logs(self, run_id: str) -> str:
        return self.flwr("log", run_id, "local", "--show")


def main(argv: list[str] | None = None) -> None:
    """Start a loopback federation from an export folder and run FairVFL on it (timing aid)."""
    p = argparse.ArgumentParser(prog="python -m fairvfl_flwr.tools.localfed", description=main.__doc__)
    p.add_argument("export_dir", type=Path, help="folder written by python -m fairvfl_flwr.tools.export")
    p.add_argument("--home", type=Path, default=None, help="working folder (default: <export_dir>/federation)")
    p.add_argument("--run-config", default="", help="extra run config, e.g. \"num-server-rounds=5\"")
    p.add_argument("--poll", type=float, default=None, help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes")
    p.add_argument("--partition-only", action="store_true",
                   help="start nodes with partition-id/num-partitions only (the packaged data, no party files)")
    args = p.parse_args(argv)
    manifest = json.loads((args.export_dir / "manifest.json").read_text())
    nodes = manifest["node_configs"]
    run_config = dict(manifest["run_config"])
    if args.partition_only:
        nodes = [{"partition-id": i, "num-partitions": len(nodes)} for i in range(len(nodes))]
        run_config.pop("server-labels", None)
    run_config.update(parse_run_config(args.run_config, "--run-config"))
    env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(args.poll)} if args.poll else None
    with LocalFederation(args.home or args.export_dir / "federation", nodes, env=env) as fed:
        started = time.perf_counter()
        run_id, status = fed.run(run_config)
        print(json.dumps({"run_id": run_id, "status": status, "seconds": time.perf_counter() - started}))
    if status != "finished:completed":  # a failed run (a party stayed away, a bad reply, divergence): non-zero exit
        raise SystemExit(1)


if __name__ == "__main__":
    main()
