"""Seconds per round on a loopback deployment with 6 SuperNodes: no-op floor vs FairVFL.

    python scripts/measure_deploy.py --rounds 5 [--dataset crime] [--before /path/to/old/checkout]

Starts a fresh SuperLink and 6 SuperNodes per setting (all on 127.0.0.1, stopped at the
end) and prints one JSON line per setting:

* ``noop``: scripts/noop_app (one empty message per node per round; the Flower floor);
* ``fairvfl``: this app on exported party files (node-config data-path, server-labels);
* ``before`` (optional): an older checkout of the app, nodes started with
  partition-id/num-partitions as that version expects;
* ``variant`` (with ``--variant``): this app again with extra run config on top, e.g. secure
  aggregation, so its cost per round is measured against ``fairvfl`` in the same run.

``--run-config`` adds run config (Flower's syntax) to ``fairvfl`` and ``variant``; ``--variant``
adds more to ``variant`` only. ``fairvfl`` runs the export's run config, which turns secure
aggregation on (the deployment default). Per round with and without it, block Newton
running every round (``stop-tolerance=0``: both runs have the same number of rounds)::

    python scripts/measure_deploy.py --rounds 10 --dataset adult --poll 0.05 \
        --run-config "optimizer='newton' stop-tolerance=0" \
        --variant "privacy.secure-aggregation=false" --settings noop,fairvfl,variant

The last line printed is the ratio variant / fairvfl of seconds per round at each poll.
``--name NAME`` also writes the figures, with the ratios to ``fairvfl`` and ``noop`` of the same
run, to docs/results/<topic>/NAME.md and .json (bench/common.py).

Each setting runs with the SuperExec's default task poll (1 s) and with
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.05`` unless ``--poll`` is given. Round 0 (FAB
install, discovery) is excluded: seconds per round is the median of rounds 1..R.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.tools.export import export  # noqa: E402
from fairvfl_flwr.tools.cli import parse_run_config  # noqa: E402
from fairvfl_flwr.tools.localfed import LocalFederation  # noqa: E402
from fairvfl_flwr.tools.results import page_name  # noqa: E402


def _fairvfl_rounds(out: Path) -> list[float]:
    (summary,) = out.glob("*/history.json")
    # "seconds" restarts after set-up (discovery + init, recorded as round 0): round 1 is seconds[1]
    seconds = [r["seconds"] for r in json.loads(summary.read_text())][1:]
    return seconds[:1] + [b - a for a, b in zip(seconds, seconds[1:])]


def measure(kind: str, home: Path, manifest: dict, rounds: int, poll: str | None, app: Path | None = None,
            extra: dict | None = None, rtt_ms: float | None = None, mbit: float = 0.0) -> dict:
    """One setting's seconds per round; with ``rtt_ms``, the SuperNodes reach the SuperLink
    through scripts/wan_proxy.py (that round trip, ``mbit`` per direction)."""
    env = {"FAIRVFL_CACHE_DIR": str(home / "cache")}
    if poll:
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = poll
    nodes = manifest["node_configs"]
    if kind in ("fairvfl", "variant") and not {**manifest["run_config"], **(extra or {})}.get("privacy.secure-aggregation"):
        # the parties' operators accept an unmasked run, on nodes without identity keys (a node
        # that holds them refuses unmasked jobs)
        nodes = [{**{k: v for k, v in n.items() if k not in ("identity-key", "peers")}, "allow-unmasked": True}
                 for n in nodes]
    if kind == "before":
        nodes = [{"partition-id": i, "num-partitions": len(nodes)} for i in range(len(nodes))]
    started = time.perf_counter()
    fed = LocalFederation(home / "fed", nodes, env=env)
    proxy = None
    if rtt_ms is not None:
        from wan_proxy import WanProxy  # noqa: PLC0415 (this folder's script, only with a WAN)

        proxy = WanProxy(fed.port, rtt_ms=rtt_ms, mbit=mbit, max_seconds=1800).start()
        fed.node_superlink = f"127.0.0.1:{proxy.port}"
    with fed:
        if kind == "noop":
            out = home / "noop.json"
            run_id, status = fed.run({"num-server-rounds": rounds, "output": str(out)}, app=REPO / "scripts" / "noop_app")
            per_round = json.loads(out.read_text())["seconds"][1:] if out.exists() else []
        else:
            cfg = {"num-server-rounds": rounds, "eval-every": rounds, "output-dir": str(home / "out"),
                   "dataset": manifest["dataset"]}
            if kind in ("fairvfl", "variant"):
                cfg.update(manifest["run_config"])
                cfg.update(extra or {})
            run_id, status = fed.run(cfg, app=app or REPO)
            per_round = _fairvfl_rounds(home / "out") if status == "finished:completed" else []
    wan = {}
    if proxy is not None:
        proxy.stop()
        wan = {"rtt_ms": rtt_ms, "mbit": mbit, "proxy_bytes": proxy.bytes, "proxy_connections": proxy.connections,
               "proxy_turns": proxy.turns}
    return {**wan,
        "setting": kind, "poll": poll or "1.0 (default)", "status": status, "rounds": rounds, "run_config": extra or {},
        "seconds_per_round": statistics.median(per_round) if per_round else None,
        "per_round": [round(s, 2) for s in per_round], "wall_seconds": round(time.perf_counter() - started, 1),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dataset", default="crime")
    p.add_argument("--before", type=Path, default=None, help="an older checkout of the app (e.g. git archive of a commit)")
    p.add_argument("--poll", action="append", default=None, help="SuperExec task poll interval(s) to try")
    p.add_argument("--settings", default="noop,fairvfl", help="comma list of noop,fairvfl,before,variant")
    p.add_argument("--run-config", default="", help="extra run config of fairvfl and variant (Flower's syntax)")
    p.add_argument("--name", type=page_name, default="", help="write the page NAME (docs/results/<its topic>/NAME.md) and its .json with the figures")
    p.add_argument("--variant", default="", help="run config on top of --run-config for the variant setting, "
                   "e.g. \"privacy.secure-aggregation=false\"")
    args = p.parse_args()
    base = parse_run_config(args.run_config, "--run-config")
    variant = {**base, **parse_run_config(args.variant, "--variant")}
    if "variant" in args.settings.split(",") and not args.variant:
        p.error("the variant setting needs --variant \"key=value ...\"")
    polls = args.poll or [None, "0.05"]
    with tempfile.TemporaryDirectory(prefix="fairvfl-measure-") as tmp:
        tmp = Path(tmp)
        manifest = export(RunConfig(dataset=args.dataset), tmp / "parties", demo_keys=True)
        settings = args.settings.split(",") + (["before"] if args.before and "before" not in args.settings else [])
        ratios, results = {}, []
        for poll in polls:
            per_round = {}
            for kind in settings:
                home = tmp / f"{kind}-{poll}"
                res = measure(kind, home, manifest, args.rounds, poll, app=args.before if kind == "before" else None,
                              extra=variant if kind == "variant" else base)
                per_round[kind] = res["seconds_per_round"]
                results.append(res)
                print(json.dumps(res), flush=True)
            for res in results[-len(settings):]:
                for floor in ("fairvfl", "variant", "noop"):
                    if res["seconds_per_round"] and per_round.get(floor):
                        res[f"over_{floor}"] = round(res["seconds_per_round"] / per_round[floor], 3)
            if per_round.get("variant") and per_round.get("fairvfl"):
                ratios[poll or "1.0 (default)"] = round(per_round["variant"] / per_round["fairvfl"], 3)
        if ratios:
            print(json.dumps({"variant_over_fairvfl_per_round": ratios, "variant": args.variant}), flush=True)
    if args.name:
        _page(args, results)


def _page(args: argparse.Namespace, results: list[dict]) -> None:
    from bench.common import DEFAULT_OUT, table, write  # noqa: PLC0415 (only when a page is asked for)

    rows = [{**r, "run_config": " ".join(f"{k}={v}" for k, v in r["run_config"].items()) or "(the export's)"}
            for r in results]
    cols = ["setting", "poll", "status", "rounds", "run_config", "seconds_per_round", "over_fairvfl", "over_variant", "over_noop",
            "wall_seconds", "load_average"]
    md = (f"Seconds per deployed round, {args.dataset}, 6 SuperNodes on this machine, median of rounds 1 to "
          f"{args.rounds} (round 0, the FAB install and discovery, left out); `fairvfl` runs the export's run config "
          f"(secure aggregation on) with `{args.run_config or '(nothing more)'}`, `variant` adds `{args.variant}`; "
          "`over_*`: this row's seconds per round over that setting's, same poll, same run\n\n" + table(rows, cols))
    write(DEFAULT_OUT, args.name, {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, md,
          title="Seconds per deployed round against the no-op floor")


if __name__ == "__main__":
    main()
