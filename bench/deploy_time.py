"""Where a deployed round's seconds go: a loopback deployment split into Flower's waits,
process start, our import and our compute, next to the no-op floor in the same run.

    python bench/deploy_time.py [--dataset crime] [--rounds 3] [--poll default --poll 0.05] \\
        [--run-config "optimizer='newton'"] [--out docs/results]

Per poll setting (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` of the SuperNodes; ``default`` is
Flower's 1 s) it starts a fresh SuperLink and one SuperNode per party on 127.0.0.1 and runs

* ``noop``: scripts/noop_app, one empty message per node per round (Flower's floor);
* ``fairvfl``: this app on exported party files, with ``FAIRVFL_TIMING_LOG`` set
  (features/timing.py: the ClientApp and ServerApp write time stamps to local files,
  nothing goes on the wire).

The timing logs are joined by message id. For each training message, push → reply is cut into:

| part | from → to | whose |
|---|---|---|
| SuperNode pull wait | server push → the SuperNode has pulled it | Flower: SuperNode sleeps 3 s after an empty pull |
| SuperExec start | SuperNode has it → ClientApp process exists | Flower: object pull, SuperExec task poll (1 s default), spawn |
| ClientApp start | process start → our import begins | Flower: interpreter, flwr import, task pull, FAB install |
| our import | import of client_app.py and the package | ours |
| Flower call | import done → first mod | Flower |
| our compute | mods + handler | ours |
| reply to SuperNode | handler end → the SuperNode sends the reply | Flower: push to the SuperNode, its 0.5 s reply poll |
| reply to server | SuperNode sends → the server has the reply | Flower: SuperLink, the server's 10 ms poll |

The SuperNode's times come from its own log (``FLWR_LOG_LEVEL=DEBUG`` adds time stamps to
Flower's log lines; ``--no-flower-log`` leaves it off, and then the first two parts and the
last two are reported as one each).

and the server's own compute (last reply of round t−1 → first push of round t). A round is
server compute + the slowest party's push → reply ("critical path", the table's first
column); the second column is the mean over all parties' messages. Rounds 1..R only
(discovery, init and round 0's FAB install excluded). ``--run-config`` is passed to ``flwr
run`` as is (Flower's syntax), after the bench's own keys.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, page_name, write  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.tools.export import export  # noqa: E402
from fairvfl_flwr.tools.cli import parse_run_config  # noqa: E402
from fairvfl_flwr.tools.localfed import LocalFederation  # noqa: E402

NOOP_APP = REPO / "scripts" / "noop_app"
TIMING_ENV = "FAIRVFL_TIMING_LOG"
PARTS = [
    ("supernode_wait", "SuperNode pull wait (Flower: 3 s idle sleep)"),
    ("superexec_start", "SuperExec task poll + spawn (Flower)"),
    ("clientapp_start", "ClientApp process start: Python, flwr, FAB (Flower)"),
    ("our_import", "our import (client_app.py + package)"),
    ("flower_call", "Flower's call into the app"),
    ("our_compute", "our compute (mods + handler)"),
    ("reply_to_supernode", "reply to SuperNode: push, its 0.5 s reply poll (Flower)"),
    ("reply_to_server", "reply to server: SuperLink, server's 10 ms poll (Flower)"),
]
SERVER_PART = ("server_compute", "server compute (fold, record, dual step, ν)")


def poll_env(poll: str | None) -> dict:
    return {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": poll} if poll and poll != "default" else {}


def deploy(home: Path, nodes: list[dict], run_config: dict, env: dict, app: Path = REPO, timeout: float = 3600,
           on_start=None, node_env: dict | None = None) -> dict:
    """One run on a fresh loopback federation; seconds from ``flwr run`` to the run's end."""
    with LocalFederation(home, nodes, env=env, node_env=node_env) as fed:
        if on_start is not None:
            on_start(fed)
        submitted = time.time()
        run_id = fed.submit(run_config, app=app)
        status = fed.wait(run_id, timeout)
        ended = time.time()
        logs = fed.logs(run_id) if status != "finished:completed" else ""
    return {"run_id": run_id, "status": status, "submitted": submitted, "finished": ended, "log_tail": logs[-3000:]}


def noop_round_seconds(out: Path) -> list[float]:
    return json.loads(out.read_text())["seconds"][1:] if out.exists() else []


def history(out_dir: Path) -> list[dict]:
    (path,) = Path(out_dir).glob("*/history.json")
    return json.loads(path.read_text())


def history_round_seconds(rows: list[dict]) -> list[float]:
    """Per-round seconds of rounds 1..R from the app's own clock (restarted after round 0)."""
    seconds = [r["seconds"] for r in rows if r["round"] >= 1]
    return seconds[:1] + [b - a for a, b in zip(seconds, seconds[1:])]


# -- the timing logs ---------------------------------------------------------------------
LOG_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}).*?(Receiving|Sending): (\S+) message \(ID: ([0-9a-f]+)\)")


def supernode_times(fed_home: Path) -> dict[str, float]:
    """Message id → when a SuperNode logged receiving (a server message) or sending (a reply) it.

    Flower writes these lines with a time stamp only at ``FLWR_LOG_LEVEL=DEBUG``; its
    time stamps are local time, to the millisecond.
    """
    out = {}
    for f in Path(fed_home).glob("supernode*.log"):
        for m in LOG_LINE.finditer(f.read_text(errors="replace")):
            out[m.group(4)] = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return out


def node_spans(fed_home: Path, first_round: int = 1) -> list[float]:
    """Seconds from a SuperNode receiving a round's message to it sending the reply (rounds >=
    ``first_round``), from the SuperNodes' own logs: the same span for any app, the no-op included."""
    spans = []
    for f in sorted(Path(fed_home).glob("supernode*.log")):
        received, round_no = None, None
        for line in f.read_text(errors="replace").splitlines():
            tag = re.search(r"ROUND (\w+)\]", line)
            if tag:
                round_no = tag.group(1)
            m = LOG_LINE.search(line)
            if not m:
                continue
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if m.group(2) == "Receiving":
                received = t if round_no and round_no.isdigit() and int(round_no) >= first_round else None
            elif received is not None:
                spans.append(t - received)
                received = None
    return spans


def read_logs(folder: Path) -> tuple[list[dict], list[dict], dict[int, dict]]:
    """(the ServerApp's records, the ClientApps' message records, each ClientApp process's exit record by pid)."""
    server, client, exits = [], [], {}
    for f in sorted(Path(folder).glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if f.name.startswith("serverapp"):
                server.append(rec)
            elif rec["event"] == "exit":
                exits[rec["pid"]] = rec
            else:
                client.append(rec)
    return server, client, exits


def message_parts(push: dict, client: dict, pull: dict, node_log: dict[str, float]) -> dict:
    """One message's push → reply, cut at the time stamps every process logged.

    The push counts from the start of the server's push call: a SuperNode may pull the
    first message while the server is still pushing the others.
    """
    received = node_log.get(push["message_id"]) or client.get("delivered")
    sent = node_log.get(pull.get("message_id", ""))
    parts = {
        "supernode_wait": (received - push["t_call"]) if received else None,
        "superexec_start": client["process_start"] - (received or push["t_call"]),
        "clientapp_start": client["import_start"] - client["process_start"],
        "our_import": client["import_done"] - client["import_start"],
        "flower_call": client["handler_start"] - client["import_done"],
        "our_compute": client["handler_end"] - client["handler_start"],
        "reply_to_supernode": (sent - client["handler_end"]) if sent else None,
        "reply_to_server": pull["t"] - (sent or client["handler_end"]),
    }
    parts["total"] = pull["t"] - push["t_call"]
    return parts


def breakdown(folder: Path, fed_home: Path | None = None) -> dict:
    """Per-round parts (critical path and mean over parties) from one run's timing logs
    (and its SuperNodes' logs under ``fed_home``, when Flower wrote time stamps)."""
    server, client, _ = read_logs(folder)
    node_log = supernode_times(fed_home) if fed_home else {}
    pushes = {r["message_id"]: r for r in server if r["event"] == "push"}
    pulls = {r["reply_to"]: r for r in server if r["event"] == "pull" and not r["error"]}
    by_round: dict[int, list[tuple[dict, dict]]] = defaultdict(list)
    last_reply: dict[int, float] = {}
    first_push: dict[int, float] = {}
    bytes_in, bytes_out = [], []
    for rec in client:
        push, pull = pushes.get(rec["message_id"]), pulls.get(rec["message_id"])
        if push is None or pull is None or not rec["group"].isdigit():
            continue
        t = int(rec["group"])
        first_push[t] = min(first_push.get(t, push["t_call"]), push["t_call"])
        last_reply[t] = max(last_reply.get(t, pull["t"]), pull["t"])
        if t >= 1 and rec["type"].startswith("train"):
            by_round[t].append((message_parts(push, rec, pull, node_log), pull))
            bytes_in.append(push["bytes"])
            bytes_out.append(pull["bytes"])
    rounds = []
    for t in sorted(by_round):
        msgs = by_round[t]
        crit = max(msgs, key=lambda m: m[1]["t"])[0]
        mean = {k: statistics.mean(m[0][k] for m in msgs) for k in crit if crit[k] is not None}
        server_s = first_push[t] - last_reply[t - 1] if t - 1 in last_reply else None
        rounds.append({"round": t, "critical": crit, "mean": mean, "server_compute": server_s,
                       "span": (last_reply[t] - last_reply[t - 1]) if t - 1 in last_reply else None,
                       "parties": len(msgs), "first_process": [m[0]["our_import"] for m in msgs]})
    import_from = sorted({r.get("app", "") for r in client})
    return {"rounds": rounds, "bytes_to_party": bytes_in, "bytes_from_party": bytes_out, "app_files": import_from}


def summarise(bd: dict) -> dict:
    """Mean over rounds of each part: critical path, and mean over parties."""
    rounds = bd["rounds"]
    out = {}
    for key, _ in PARTS + [("total", "")]:
        crit = [r["critical"][key] for r in rounds if r["critical"].get(key) is not None]
        mean = [r["mean"][key] for r in rounds if key in r["mean"]]
        out[key] = (statistics.mean(crit) if crit else None, statistics.mean(mean) if mean else None)
    server = [r["server_compute"] for r in rounds if r["server_compute"] is not None]
    span = [r["span"] for r in rounds if r["span"] is not None]
    out["server_compute"] = (statistics.mean(server) if server else None, None)
    out["round"] = (statistics.mean(span) if span else None, None)
    return out


def breakdown_table(results: list[dict]) -> str:
    """Markdown: one column pair per poll setting."""
    head = "| part | " + " | ".join(f"poll {r['poll']}: critical s | mean s | % of round" for r in results) + " |"
    lines = [head, "|" + "---|" * (1 + 3 * len(results))]

    def fmt(v):
        return "–" if v is None else f"{v:.3f}"

    for key, label in PARTS + [SERVER_PART, ("round", "**round (last reply to last reply)**")]:
        cells = []
        for r in results:
            crit, mean = r["summary"][key]
            rnd = r["summary"]["round"][0]
            share = f"{100 * crit / rnd:.0f} %" if crit is not None and rnd else ""
            cells += [fmt(crit), fmt(mean), share]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="crime")
    ap.add_argument("--parties", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--poll", action="append", default=None,
                    help="SuperExec task poll interval(s): 'default' (Flower's 1 s) or seconds; repeatable")
    ap.add_argument("--run-config", default="", help="extra run config for FairVFL, Flower's syntax")
    ap.add_argument("--no-noop", action="store_true", help="skip the no-op floor")
    ap.add_argument("--no-flower-log", action="store_true",
                    help="leave FLWR_LOG_LEVEL alone (no SuperNode time stamps: coarser split)")
    ap.add_argument("--keep", type=Path, default=None, help="keep logs and runs here (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--name", type=page_name, default="deploy_time")
    args = ap.parse_args(argv)
    polls = args.poll or ["default", "0.05"]
    extra = parse_run_config(args.run_config, "--run-config")
    with tempfile.TemporaryDirectory(prefix="fairvfl-deploytime-") as tmp:
        tmp = args.keep or Path(tmp)
        manifest = export(RunConfig(dataset=args.dataset, num_parties=args.parties), tmp / "parties", demo_keys=True)
        results = []
        for poll in polls:
            env = {"FAIRVFL_CACHE_DIR": str(tmp / "cache"), **poll_env(poll)}
            node_env = {} if args.no_flower_log else {"FLWR_LOG_LEVEL": "DEBUG"}
            res: dict = {"poll": poll, "load_before": os.getloadavg()[0]}
            if not args.no_noop:
                out = tmp / f"noop-{poll}.json"
                run = deploy(tmp / f"fed-noop-{poll}", manifest["node_configs"],
                             {"num-server-rounds": args.rounds, "output": str(out)}, env, app=NOOP_APP, node_env=node_env)
                res["noop_per_round"] = noop_round_seconds(out)
                res["noop_status"] = run["status"]
            log = tmp / f"timing-{poll}"
            cfg = {**manifest["run_config"], "num-server-rounds": args.rounds, "eval-every": args.rounds,
                   "output-dir": str(tmp / f"out-{poll}"), **extra}
            run = deploy(tmp / f"fed-fairvfl-{poll}", manifest["node_configs"], cfg, {**env, TIMING_ENV: str(log)},
                         node_env=node_env)
            res["fairvfl_status"] = run["status"]
            if run["status"] != "finished:completed":
                print(run["log_tail"], file=sys.stderr)
                raise SystemExit(f"FairVFL run ended {run['status']}")
            res["fairvfl_per_round"] = history_round_seconds(history(tmp / f"out-{poll}"))
            for kind in ("noop", "fairvfl"):
                spans = node_spans(tmp / f"fed-{kind}-{poll}")
                res[f"{kind}_node_span_median"] = statistics.median(spans) if spans else None
            bd = breakdown(log, tmp / f"fed-fairvfl-{poll}")
            res["breakdown"] = bd["rounds"]
            res["summary"] = summarise(bd)
            res["app_files"] = bd["app_files"]
            res["bytes_to_party"] = sorted(set(bd["bytes_to_party"]))
            res["bytes_from_party"] = sorted(set(bd["bytes_from_party"]))
            res["load_after"] = os.getloadavg()[0]
            fair = statistics.median(res["fairvfl_per_round"])
            res["fairvfl_s_per_round"] = fair
            if res.get("noop_per_round"):
                res["noop_s_per_round"] = statistics.median(res["noop_per_round"])
                res["ratio"] = fair / res["noop_s_per_round"]
            print(json.dumps({k: v for k, v in res.items() if k not in ("breakdown",)}, default=float), flush=True)
            results.append(res)
    lines = [f"Loopback deployment, {args.dataset}, {args.parties} SuperNodes, {args.rounds} rounds (rounds 1..R), "
             f"run config {args.run_config or '(defaults)'}; load average {results[0]['load_before']:.1f} before, "
             f"{results[-1]['load_after']:.1f} after.", ""]
    lines += ["| poll | no-op s/round | FairVFL s/round | FairVFL / no-op | node span no-op s | node span FairVFL s |",
              "|---|---|---|---|---|---|"]
    for r in results:
        noop = r.get("noop_s_per_round")
        spans = [r.get(f"{k}_node_span_median") for k in ("noop", "fairvfl")]
        spans_md = " | ".join("–" if v is None else f"{v:.2f}" for v in spans)
        lines.append(f"| {r['poll']} | {noop:.2f} | {r['fairvfl_s_per_round']:.2f} | {r['ratio']:.2f} | {spans_md} |" if noop
                     else f"| {r['poll']} | – | {r['fairvfl_s_per_round']:.2f} | – | {spans_md} |")
    lines += ["", breakdown_table(results)]
    write(args.out, args.name, {"args": vars(args) | {"out": str(args.out), "keep": str(args.keep)},
                                "results": results}, "\n".join(lines), title="A deployed round, part by part")
    return {"results": results}


if __name__ == "__main__":
    main()
