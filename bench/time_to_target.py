"""Time to a fair model, end to end: seconds from ``flwr run`` to the summary on a loopback
deployment, the same run in simulation, and the no-op floor for as many rounds, in one run.

    python bench/time_to_target.py [--rounds 20] [--dataset adult] [--epsilon 0.01] \\
        [--modes deploy,inprocess,noop[,flwr-sim]] [--poll 0.05] [--run-config "optimizer='newton'"]

* ``deploy``: a fresh SuperLink and one SuperNode per party (6) on 127.0.0.1, party files
  from ``fairvfl_flwr.tools.export``, ``--disable-runtime-dependency-installation`` and the
  SuperExec task poll ``--poll`` (``default``: Flower's 1 s). Seconds are counted from
  the ``flwr run`` submission; the round at which the target is met comes from the run's
  history (evaluation every round) and its time from the timing log (features/timing.py:
  when the server received that round's last reply).
* ``inprocess``: the same run config through the real ServerApp and ClientApp on the
  in-process grid (no transport; ``app/run.py``).
* ``flwr-sim`` (optional, Ray start-up included): ``flwr run`` in simulation.
* ``noop``: scripts/noop_app on the same kind of federation for the same number of rounds
  (plus its round 0; after ``deploy``, the rounds that deployment ran): the least any Flower
  app pays for these rounds.

``--tables own`` deploys from own tables instead (deploy and noop only): four organisations'
raw tables cut from all of Adult (tools/owntables.py: each its own id column name, its own
columns and a different 85-95 % of the people), each SuperNode with its own identity key and
the pinned peers file, run config ``tables.own = true`` and nothing else of the bench's
beyond rounds, evaluation and ε: the run aligns privately, then trains under the defaults
(masked). ``--sensitive sex,race`` moves race to the label owner and constrains the groups of
sex × race.

Target (bench/rounds.py): test accuracy within 0.5 points of the run's final value and
train DEO ≤ ε + 0.005, from that evaluated round on. ``--run-config`` is passed as is
(Flower's syntax) after the bench's own keys, e.g. ``"optimizer='newton' num-server-rounds=30"``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, page_name, table, write  # noqa: E402
from bench.deploy_time import NOOP_APP, TIMING_ENV, deploy, history, poll_env, read_logs  # noqa: E402
from bench.rounds import rounds_to_target  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.secure import identity  # noqa: E402
from fairvfl_flwr.tools import owntables  # noqa: E402
from fairvfl_flwr.tools.export import export  # noqa: E402
from fairvfl_flwr.tools.cli import parse_run_config  # noqa: E402


def quality(rows: list[dict], eps: float) -> dict:
    last = rows[-1]
    return {"rounds": last["round"], "rounds_to_target": rounds_to_target(rows, eps),
            "final_acc": 100 * last["acc"], "final_train_deo": last["deo"]}


def run_deploy(tmp: Path, manifest: dict, cfg: dict, env: dict, eps: float) -> dict:
    log = tmp / "timing-deploy"
    run = deploy(tmp / "fed-deploy", manifest["node_configs"], {**cfg, "output-dir": str(tmp / "out-deploy")},
                 {**env, TIMING_ENV: str(log)})
    if run["status"] != "finished:completed":
        print(run["log_tail"], file=sys.stderr)
        raise SystemExit(f"deployment ended {run['status']}")
    (summary,) = (tmp / "out-deploy").glob("*/summary.json")
    rows = history(tmp / "out-deploy")
    out = quality(rows, eps)
    t0 = run["submitted"]
    server, client, exits = read_logs(log)
    out["message_rounds"] = len({r["group"] for r in server if r["event"] == "push"})
    out.update(_clientapp_cpu(client, exits))
    start = next(r for r in server if r["event"] == "start")
    last_reply: dict[int, float] = {}
    for r in server:
        if r["event"] == "pull" and str(r["group"]).isdigit():
            last_reply[int(r["group"])] = max(last_reply.get(int(r["group"]), 0.0), r["t"])
    target = out["rounds_to_target"]
    out.update({
        "s_to_summary": summary.stat().st_mtime - t0,
        "s_to_finished": run["finished"] - t0,
        "s_to_serverapp": (start["process_start"] or start["t"]) - t0,
        "s_to_round1": last_reply.get(0, t0) - t0,  # discovery + init (round 0) done
        "s_to_target": (last_reply[target] - t0) if target is not None else None,
        "s_per_round": (last_reply[max(last_reply)] - last_reply[0]) / max(1, max(last_reply)),
    })
    return out


def own_federation(tmp: Path, sensitive: str) -> tuple[dict, dict]:
    """Four organisations' own tables, each with its own identity key and the pinned peers (a
    manifest as ``export`` gives), and the run config that trains on them."""
    nodes = owntables.organisations(tmp / "tables", sensitive)
    identities = identity.generate_identities(tmp / "identities", len(nodes))
    return ({"node_configs": [{**node, **identities[k]} for k, node in enumerate(nodes)]},
            {"tables.own": True, "num-parties": len(nodes)})


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _clientapp_cpu(client: list[dict], exits: dict[int, dict]) -> dict:
    """Median CPU seconds of one ClientApp process of a training round (the timing log's
    message and exit records): in all, and before the app's import began (Flower's start-up:
    interpreter, flwr, task pull, FAB install), our import and our handler."""
    rounds = [{**m, "exit_cpu": exits[m["pid"]]["cpu"]} for m in client
              if str(m.get("group", "")).isdigit() and exits.get(m["pid"], {}).get("cpu") is not None]
    return {"clientapp_cpu_s": _median([p["exit_cpu"] for p in rounds]),
            "clientapp_cpu_before_app_s": _median([p["cpu_import_start"] for p in rounds]),
            "clientapp_cpu_import_s": _median([p["cpu_import_done"] - p["cpu_import_start"] for p in rounds]),
            "clientapp_cpu_handler_s": _median([p["cpu_handler_end"] - p["cpu_handler_start"] for p in rounds])}


def run_inprocess(tmp: Path, cfg: dict, eps: float) -> dict:
    from fairvfl_flwr.app.run import run_inprocess as run_app

    t0 = time.perf_counter()
    summary, folder = run_app({**cfg, "output-dir": str(tmp / "out-inprocess")}, quiet=True)
    wall = time.perf_counter() - t0
    rows = json.loads((Path(folder) / "history.json").read_text())
    out = quality(rows, eps)
    target = out["rounds_to_target"]
    by_round = {r["round"]: r["seconds"] for r in rows}
    out.update({"s_to_summary": wall, "s_to_round1": summary.get("setup_seconds"),
                "s_to_target": (summary.get("setup_seconds", 0.0) + by_round[target]) if target is not None else None,
                "s_per_round": by_round[max(by_round)] / max(1, max(by_round))})
    return out


def run_flwr_sim(tmp: Path, cfg: dict, eps: float, parties: int) -> dict:
    from fairvfl_flwr.tools.flwr_engine import SimulationSuperLink

    t0 = time.time()
    with SimulationSuperLink(tmp / "sim-home") as link:
        link.run({**cfg, "output-dir": str(tmp / "out-sim")}, num_supernodes=parties)
    (summary,) = (tmp / "out-sim").glob("*/summary.json")
    rows = history(tmp / "out-sim")
    out = quality(rows, eps)
    out["s_to_summary"] = summary.stat().st_mtime - t0
    out["s_of_rounds"] = rows[-1]["seconds"]  # the ServerApp's clock: round 1 to the last round's end
    return out


def run_noop(tmp: Path, manifest: dict, rounds: int, env: dict) -> dict:
    out = tmp / "noop.json"
    log = tmp / "timing-noop"
    run = deploy(tmp / "fed-noop", manifest["node_configs"], {"num-server-rounds": rounds, "output": str(out)},
                 {**env, TIMING_ENV: str(log)}, app=NOOP_APP)
    seconds = json.loads(out.read_text())["seconds"]
    exits = [json.loads(line) for f in log.glob("noop-clientapp-*.jsonl") for line in f.read_text().splitlines()]
    return {"rounds": rounds, "message_rounds": rounds + 1, "status": run["status"],
            "s_to_summary": out.stat().st_mtime - run["submitted"],
            "s_to_finished": run["finished"] - run["submitted"], "s_per_round": sum(seconds[1:]) / max(1, rounds),
            "clientapp_cpu_s": _median([e["cpu"] for e in exits]),
            "clientapp_cpu_before_app_s": _median([e["cpu_handler_start"] for e in exits])}


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux ``PR_SET_CHILD_SUBREAPER``).

    A SuperNode stopped before its SuperExec leaves the SuperExec, and with it the CPU of
    every ClientApp process it reaped, to init; adopted, they are reaped here and counted."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        print("note: cannot adopt orphaned processes here; cpu_s undercounts the federations", file=sys.stderr)


def _reap() -> None:
    """Wait for every exited descendant this process adopted."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.2)  # adopted processes still running: give them the SIGKILL's moment
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been reaped."""
    _reap()
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--parties", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--epsilon", type=float, default=0.01)
    ap.add_argument("--modes", default="deploy,inprocess,noop", help="comma list of deploy, inprocess, flwr-sim, noop")
    ap.add_argument("--deploy", action="store_true", help="deployment only (same as --modes deploy,noop)")
    ap.add_argument("--poll", default="default",
                    help="SuperExec task poll of the SuperNodes, seconds ('default': Flower's 1 s, the faster on 2 cores)")
    ap.add_argument("--run-config", default="", help="extra run config (Flower's syntax), e.g. \"optimizer='newton'\"")
    ap.add_argument("--tables", choices=["export", "own"], default="export",
                    help="party files exported from one table (default), or four organisations' own tables")
    ap.add_argument("--sensitive", default="sex", help="--tables own: the label owner's sensitive column(s)")
    ap.add_argument("--keep", type=Path, default=None, help="keep logs and runs here (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--name", type=page_name, default="time_to_target")
    args = ap.parse_args(argv)
    modes = ["deploy", "noop"] if args.deploy else args.modes.split(",")
    extra = parse_run_config(args.run_config, "--run-config")
    rounds = int(extra.get("num-server-rounds", args.rounds))
    eps = float(extra.get("epsilon", args.epsilon))
    results = []
    _adopt_orphans()
    with tempfile.TemporaryDirectory(prefix="fairvfl-ttt-") as tmp:
        tmp = args.keep or Path(tmp)
        if args.tables == "own":
            if set(modes) - {"deploy", "noop"}:
                raise SystemExit("--tables own runs the modes deploy and noop only")
            manifest, base = own_federation(tmp, args.sensitive)
        else:
            manifest = export(RunConfig(dataset=args.dataset, num_parties=args.parties), tmp / "parties", demo_keys=True)
            base = manifest["run_config"]
        cfg = {**base, "num-server-rounds": rounds, "eval-every": 1, "epsilon": eps, **extra}
        sim_cfg = {k: v for k, v in cfg.items() if k != "server-labels"}  # simulation: the packaged table
        env = {"FAIRVFL_CACHE_DIR": str(tmp / "cache"), **poll_env(args.poll)}
        for mode in modes:
            load = os.getloadavg()[0]
            cpu = _cpu_seconds()
            if mode == "deploy":
                res = run_deploy(tmp, manifest, cfg, env, eps)
            elif mode == "inprocess":
                res = run_inprocess(tmp, sim_cfg, eps)
            elif mode == "flwr-sim":
                res = run_flwr_sim(tmp, sim_cfg, eps, args.parties)
            elif mode == "noop":  # as many rounds as the deployment ran, where it ran first and stopped early
                ran = [r["rounds"] for r in results if r["mode"] == "deploy"]
                res = run_noop(tmp, manifest, ran[0] if ran else rounds, env)
            else:
                raise SystemExit(f"unknown mode {mode!r}")
            res = {"mode": mode, "load_before": load, "load_after": os.getloadavg()[0], **res}
            # CPU seconds of every process the mode ran (this one and its reaped children: the
            # SuperLink, SuperNodes, ServerApp, every ClientApp, the flwr CLI): unlike wall
            # seconds, other users of the machine barely move it
            res["cpu_s"] = _cpu_seconds() - cpu
            if res.get("message_rounds"):
                res["cpu_s_per_message_round"] = res["cpu_s"] / res["message_rounds"]
            print(json.dumps(res, default=float), flush=True)
            results.append(res)
    cols = ["mode", "rounds", "rounds_to_target", "s_to_target", "s_to_summary", "s_to_round1", "s_per_round",
            "s_of_rounds", "message_rounds", "cpu_s", "cpu_s_per_message_round", "clientapp_cpu_s",
            "clientapp_cpu_before_app_s", "clientapp_cpu_import_s", "clientapp_cpu_handler_s", "final_acc", "final_train_deo",
            "load_before", "load_after"]
    data = (f"own tables cut from adult, groups {args.sensitive}" if args.tables == "own" else args.dataset)
    parties = len(manifest["node_configs"])
    by_mode = {r["mode"]: r for r in results}
    ratio = ""
    if "deploy" in by_mode and "noop" in by_mode:
        d, n = by_mode["deploy"], by_mode["noop"]
        ratio = (f"\n\nDeployment `flwr run` → summary over the no-op's: **{d['s_to_summary'] / n['s_to_summary']:.2f}×** "
                 f"({d['s_to_summary']:.1f} s for {d['rounds']} rounds against {n['s_to_summary']:.1f} s for "
                 f"{n['rounds']}); CPU seconds of every process, per message round: "
                 f"{d['cpu_s_per_message_round']:.1f} against {n['cpu_s_per_message_round']:.1f}.")
    md = (f"Time to target, {data} {cfg.get('model', 'linear')}, ε = {eps}, {parties} parties, {rounds} rounds, evaluation every "
          f"round, SuperExec poll {args.poll}, run config {args.run_config or '(defaults)'}; seconds from `flwr run` "
          "submission (deploy, noop) or from the call (inprocess)\n\n" + table(results, cols) + ratio)
    write(args.out, args.name, {"args": {**vars(args), "out": str(args.out), "keep": str(args.keep)},
                                "results": results}, md, title="Time to target, end to end")
    return {"results": results}


if __name__ == "__main__":
    main()
