"""Seconds per deployed round over a WAN: the no-op app and FairVFL at several round-trip times.

    python scripts/measure_wan.py --rtt 0,50,150 --rounds 2 --parties 4

For each RTT it starts a fresh loopback federation (scripts/measure_deploy.py's machinery)
whose SuperNodes reach the SuperLink through scripts/wan_proxy.py (that round trip, and
``--mbit`` per direction), runs the no-op app and FairVFL (exported Crime party files,
secure aggregation on, the deployment default) for ``--rounds`` rounds, and publishes
docs/results/deployment/wan.md. Rows measured earlier at other RTTs (docs/results/deployment/wan.json) are
kept, so the RTTs may be measured one invocation each (``--rtt 50``): each row records the
invocation that made it. Round 0 (FAB install, discovery) is left out.

    python scripts/measure_wan.py --align 100000 --rtt 0,50 --parties 4

times the private alignment of own tables instead (``--align`` ids per party, 90 % common to
all, bench/align.py's tables): each party's SuperNode reads its own table with its own
identity key and the pinned peers file, the run config is ``tables.own = true``, and the run
is stopped once every party has kept its alignment. It publishes docs/results/data/wan-align.md
(rows at other RTTs kept, as above): the alignment's seconds from the server's log, and the
proxy's bytes, TCP connections and answered requests (round trips) up to that point.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from measure_deploy import measure  # noqa: E402

from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.tools.export import export  # noqa: E402
from fairvfl_flwr.tools.results import RESULTS, page, publish, this_command  # noqa: E402

NAME = "wan"
ALIGN_NAME = "wan-align"
#: The label owner of bench/align.py's tables: its label and two groups.
ALIGN_LABEL_OWNER = {"label-column": "label", "label-positive": "yes", "sensitive-column": "group", "group-a": "f",
                     "group-b": "m", "protected-label": 1}
ALIGNED = re.compile(r"private alignment: .* ids per party, (\d+) common .* in ([0-9.]+) s")


def _rows(payload: dict) -> dict[str, dict]:
    return {f"{r['setting']}@{r['rtt_ms']:g}": r for r in payload.get("rows", [])}


def conns(row: dict) -> str:
    """TCP connections the SuperNodes opened through the proxy, per round (round 0 included)."""
    return f"{row['proxy_connections'] / (row['rounds'] + 1):.0f}" if row else "–"


def turns(row: dict) -> str:
    """Requests that waited for an answer (a round trip each), per SuperNode and round (round 0 included)."""
    if not row or "proxy_turns" not in row:
        return "–"
    return f"{row['proxy_turns'] / (row['rounds'] + 1) / row.get('parties', 1):.0f}"


def bound(row: dict, rtt: float) -> str:
    """Round trips per SuperNode and round times the RTT: at most what the WAN adds to its round."""
    if not row or "proxy_turns" not in row:
        return "–"
    return f"{row['proxy_turns'] / (row['rounds'] + 1) / row.get('parties', 1) * rtt / 1000:.1f}"


def load(row: dict) -> str:
    """The machine's 1-minute load average when the row's run ended."""
    return f"{row['load_average']:.0f}" if row else "–"


def render(rows: list[dict]) -> str:
    """The page's table: seconds per round of each app at each RTT, and what the WAN added."""
    by = {(r["setting"], r["rtt_ms"]): r for r in rows}
    rtts = sorted({r["rtt_ms"] for r in rows})
    lines = ["| RTT (ms) | no-op round (s) | FairVFL round (s) | FairVFL / no-op | added by the WAN: no-op (s) | "
             "added by the WAN: FairVFL (s) | proxy bytes per FairVFL round | TCP connections per round: no-op, "
             "FairVFL | round trips per SuperNode and round: no-op, FairVFL | round trips × RTT (s): no-op, FairVFL | "
             "load (1 min) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rtt in rtts:
        noop, fair = by.get(("noop", rtt), {}), by.get(("fairvfl", rtt), {})
        n, f = noop.get("seconds_per_round"), fair.get("seconds_per_round")
        n0 = by.get(("noop", 0.0), {}).get("seconds_per_round")
        f0 = by.get(("fairvfl", 0.0), {}).get("seconds_per_round")
        cell = lambda v, fmt="{:.1f}": fmt.format(v) if v is not None else "–"  # noqa: E731
        per_round = (fair.get("proxy_bytes", 0) / max(1, fair.get("rounds", 1) + 1)) if fair else None
        lines.append(f"| {rtt:g} | {cell(n)} | {cell(f)} | {cell(f / n if n and f else None, '{:.2f}')} | "
                     f"{cell(n - n0 if n is not None and n0 is not None else None)} | "
                     f"{cell(f - f0 if f is not None and f0 is not None else None)} | "
                     f"{cell(per_round / 1e6 if per_round else None, '{:.2f} MB')} | "
                     f"{conns(noop)}, {conns(fair)} | {turns(noop)}, {turns(fair)} | "
                     f"{bound(noop, rtt)}, {bound(fair, rtt)} | "
                     f"{load(noop)}, {load(fair)} |")
    return "\n".join(lines)


NOTES = """\
Each row: a fresh SuperLink and one SuperNode per party on 127.0.0.1, the SuperNodes
dialling scripts/wan_proxy.py in front of the SuperLink (each byte waits RTT/2 each way);
seconds per round is the median of rounds 1..R (round 0, FAB install and discovery, left
out); Flower's default SuperExec task poll (1 s). The proxy's bytes include round 0 (set-up
and secure aggregation's keys), spread over the rounds. The ServerApp runs beside the
SuperLink, as in a deployment where the label owner hosts both.

Reading it: a FairVFL round costs more than a no-op round already at 0 ms; that excess is
each message's fresh `flwr-clientapp` process (its imports) and the parties' work
([deploy-time.md](../../deploy-time.md)), not the network. The round trips per SuperNode and
round do not depend on the machine's load: times the RTT, they bound what the WAN adds to a
round of each app, and their ratio is the WAN's share of FairVFL's excess over the no-op
round. The WAN's share is the two
"added by the WAN" columns: a message costs several round trips between a SuperNode and
the SuperLink (pull the message, fetch its objects, push the reply and its objects), and
FairVFL's messages carry more arrays than the no-op app's. The proxy also counts the TCP
connections the SuperNodes open through it (each new one pays its handshakes, about two
round trips, before its first request) and the requests that waited for an answer (a
round trip each; a SuperNode's heartbeats among them, so not all on the round's path):
round trips × RTT bounds what the WAN adds to a SuperNode's round. On a loaded machine (the load column) the rounds'
own spread can exceed what the WAN adds: compare the two apps within one RTT row, and
rerun on an idle machine for the WAN's share.

What an operator can change: `FLWR_SUPEREXEC_TASK_POLL_INTERVAL` in each SuperNode's
environment (how often its executor looks for work; 0.05 s saves up to a second per message
where each SuperNode has cores of its own, [deploy.md](../../deploy.md#3-start-each-partys-supernode));
fewer rounds (block Newton, the stop rule); `score.chunk-rows` for a scoring job (fewer,
larger messages: fewer round trips at a high RTT, each message bounded by gRPC's limit);
and where the SuperLink sits (next to the label owner, whose messages are the largest).
The private alignment of own tables at these RTTs (100,000 ids × 4 parties):
[wan-align.md](../data/wan-align.md) (`--align`).
"""


def measure_alignment(home: Path, ids: int, parties: int, rtt_ms: float, mbit: float, poll: str | None,
                      timeout: float = 3600.0) -> dict:
    """One private alignment of ``parties`` own tables of ``ids`` ids each through the WAN proxy:
    the server's seconds and the proxy's counts until every party has kept its alignment."""
    from bench.align import write_tables  # noqa: PLC0415 (its table writer, only with --align)
    from wan_proxy import WanProxy  # noqa: PLC0415

    from fairvfl_flwr.data.psi import KEPT  # noqa: PLC0415
    from fairvfl_flwr.secure import identity  # noqa: PLC0415
    from fairvfl_flwr.tools.localfed import LocalFederation  # noqa: PLC0415
    from fairvfl_flwr.tools.owntables import own_node  # noqa: PLC0415

    tables = home / "tables"
    tables.mkdir(parents=True)
    common = write_tables(tables, ids, parties, overlap=0.9)
    keys = identity.generate_identities(home / "identities", parties)
    nodes = [own_node(k, tables / f"party{k}.csv", "customer", ALIGN_LABEL_OWNER, **keys[k]) for k in range(parties)]
    env = {"FAIRVFL_CACHE_DIR": str(home / "cache")}
    if poll:
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = poll
    kept = [home / "cache" / KEPT / f"last-{k}-of-{parties}.json" for k in range(parties)]
    fed = LocalFederation(home / "fed", nodes, env=env)
    proxy = WanProxy(fed.port, rtt_ms=rtt_ms, mbit=mbit, max_seconds=timeout + 300).start()
    fed.node_superlink = f"127.0.0.1:{proxy.port}"
    seen: dict = {}
    done = threading.Event()

    def watch() -> None:  # the proxy's counts when the last party has kept its alignment
        while not done.is_set():
            if all(p.exists() for p in kept):
                seen.update(bytes=proxy.bytes, connections=proxy.connections, turns=proxy.turns, at=time.monotonic())
                return
            time.sleep(0.2)

    with fed:
        run_id = fed.submit({"tables.own": True, "num-parties": parties, "num-server-rounds": 1,
                             "output-dir": str(home / "out"), "reliability.round-timeout": timeout})
        started = time.monotonic()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        found, status = None, "running"
        while time.monotonic() - started < timeout and found is None and not status.startswith("finished"):
            time.sleep(5)
            status = fed.status(run_id)[0]
            if seen:
                found = ALIGNED.search(fed.logs(run_id))
        done.set()
        log_text = fed.logs(run_id)
    proxy.stop()
    found = found or ALIGNED.search(log_text)
    if found is None:
        raise RuntimeError(f"run {run_id} ({status}) logged no finished alignment:\n{log_text[-3000:]}")
    assert int(found.group(1)) == common, f"aligned {found.group(1)} rows, {common} are common"
    return {"rtt_ms": rtt_ms, "mbit": mbit, "ids": ids, "parties": parties, "common": common,
            "seconds": float(found.group(2)), "proxy_bytes": seen.get("bytes"),
            "proxy_connections": seen.get("connections"), "proxy_turns": seen.get("turns"),
            "poll": poll or "1.0 (default)", "load_average": os.getloadavg()[0]}


def render_alignment(rows: list[dict]) -> str:
    """The alignment page's table: seconds at each RTT, what the WAN added, round trips."""
    base = {r["ids"]: r["seconds"] for r in rows if r["rtt_ms"] == 0}
    lines = ["| ids per party × parties | RTT (ms) | alignment (s) | added by the WAN (s) | proxy MB | TCP connections "
             "| round trips per SuperNode | round trips × RTT (s) | load (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_node = r["proxy_turns"] / r["parties"] if r.get("proxy_turns") is not None else None
        cells = [f"{r['ids']:,} × {r['parties']}", f"{r['rtt_ms']:g}", f"{r['seconds']:.1f}",
                 f"{r['seconds'] - base[r['ids']]:.1f}" if r["ids"] in base else "–",
                 f"{r['proxy_bytes'] / 1e6:.1f}" if r.get("proxy_bytes") is not None else "–",
                 str(r.get("proxy_connections", "–")),
                 f"{per_node:.0f}" if per_node is not None else "–",
                 f"{per_node * r['rtt_ms'] / 1000:.1f}" if per_node is not None else "–",
                 f"{r['load_average']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


ALIGN_NOTES = """\
Each row: a fresh SuperLink and one SuperNode per party on 127.0.0.1, the SuperNodes dialling
scripts/wan_proxy.py in front of the SuperLink (each byte waits RTT/2 each way), as on
[wan.md](../deployment/wan.md). Every party reads its own table (bench/align.py's made-up customers, 90 % of
each party's ids common to all, one number and one category column each, the label owner also
the label and the group) with its own identity key and the pinned peers file; run config
`tables.own = true`, nothing kept from an earlier alignment. Alignment (s) is the server's own
figure (`private alignment: ... in ... s`: the eight steps, PSI, split and every party's
preparation); the proxy's counts run from the SuperNodes' start until every party has kept its
alignment (discovery and heartbeats included), and the run is then stopped. Round trips are the
requests that waited for an answer on their connection (a round trip each): times the RTT they
bound what the WAN adds. On a loaded machine (the load column) the PSI's own time varies more
than the WAN adds: compare rows at a similar load. Align once, run many: a second run on the
same tables takes up the kept alignment in two messages per party
([deploy.md](../../deploy.md#0-each-organisation-starts-from-its-own-table)).
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rtt", default="0,50,150", help="round-trip times in ms, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--parties", type=int, default=4)
    p.add_argument("--dataset", default="crime")
    p.add_argument("--mbit", type=float, default=0.0, help="rate limit per direction and connection (0: none)")
    p.add_argument("--settings", default="noop,fairvfl")
    p.add_argument("--poll", default=None, help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL (default: Flower's 1 s)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--render-only", action="store_true", help="rewrite the page from its JSON, measuring nothing")
    p.add_argument("--align", type=int, default=0,
                   help="time the private alignment of own tables with this many ids per party instead "
                        "(publishes wan-align.md)")
    args = p.parse_args()
    if args.align:
        return main_alignment(args)
    old = page(NAME, args.out).with_suffix(".json")
    same = {"parties": args.parties, "rounds": args.rounds, "dataset": args.dataset, "mbit": args.mbit}
    rows = {k: r for k, r in (_rows(json.loads(old.read_text())) if old.is_file() else {}).items()
            if all(r.get(key) == value for key, value in same.items())}  # rows of the same set-up only
    command = this_command()
    if args.render_only:
        args.rtt = ""
    with tempfile.TemporaryDirectory(prefix="fairvfl-wan-") as tmp:
        tmp = Path(tmp)
        manifest = export(RunConfig(dataset=args.dataset, num_parties=args.parties), tmp / "parties", demo_keys=True)
        for rtt in (float(x) for x in args.rtt.split(",") if x):
            for kind in args.settings.split(","):
                res = measure(kind, tmp / f"{kind}-{rtt:g}", manifest, args.rounds, args.poll, rtt_ms=rtt,
                              mbit=args.mbit)
                res.update(command=command, **same)
                print(json.dumps(res), flush=True)
                rows[f"{kind}@{rtt:g}"] = res
    ordered = sorted(rows.values(), key=lambda r: (r["rtt_ms"], r["setting"]))
    canonical = (f"python scripts/measure_wan.py --rtt 0,50,150 --rounds {args.rounds} --parties {args.parties} "
                 f"--dataset {args.dataset}" + (f" --mbit {args.mbit:g}" if args.mbit else ""))
    written = publish(NAME, canonical, {"rows": ordered}, render(ordered),
                      title=f"Deployed rounds over a WAN: no-op app and FairVFL ({args.dataset}, {args.parties} "
                            "SuperNodes, loopback proxy)", notes=NOTES, out=args.out)
    print(written)


def main_alignment(args: argparse.Namespace) -> None:
    """``--align``: the alignment's rows, measured or kept, into wan-align.md."""
    old = page(ALIGN_NAME, args.out).with_suffix(".json")
    rows = {(r["ids"], r["parties"], r["rtt_ms"]): r for r in
            (json.loads(old.read_text()).get("rows", []) if old.is_file() else []) if r.get("mbit") == args.mbit}
    command = this_command()
    with tempfile.TemporaryDirectory(prefix="fairvfl-wan-align-") as tmp:
        for rtt in (float(x) for x in ("" if args.render_only else args.rtt).split(",") if x):
            res = measure_alignment(Path(tmp) / f"align-{rtt:g}", args.align, args.parties, rtt, args.mbit, args.poll)
            res["command"] = command
            print(json.dumps(res), flush=True)
            rows[(res["ids"], res["parties"], rtt)] = res
    ordered = sorted(rows.values(), key=lambda r: (r["ids"], r["parties"], r["rtt_ms"]))
    canonical = (f"python scripts/measure_wan.py --align {args.align} --rtt 0,50 --parties {args.parties}"
                 + (f" --mbit {args.mbit:g}" if args.mbit else ""))
    print(publish(ALIGN_NAME, canonical, {"rows": ordered}, render_alignment(ordered),
                  title="Private alignment of own tables over a WAN (loopback proxy)", notes=ALIGN_NOTES, out=args.out))


if __name__ == "__main__":
    main()
