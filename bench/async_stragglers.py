"""Synchronous vs bounded-staleness rounds with one slow party (docs/async.md).

Runs the real ServerApp strategy and ClientApp over the in-process grid with
``async_replies`` (every node answers on its own thread, replies arrive late like over a
SuperLink). Every party's train reply is held back ``--fast`` seconds, one party's
(``--slow-party``) ``--slow`` seconds (default 3x). Prints one row per setting: wall
time of the training rounds, final train DEO and loss, test accuracy/DFP/DFN, and how
stale the logits were.

    python bench/async_stragglers.py                       # Crime, 300 rounds, tau in {1, 2, 4}
    python bench/async_stragglers.py --dataset adult --rounds 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402
from fairvfl_flwr.app.client import app as client_app  # noqa: E402
from fairvfl_flwr.config import RunConfig  # noqa: E402
from fairvfl_flwr.flower.inprocess import InProcessGrid  # noqa: E402
from fairvfl_flwr.app.server import run_server  # noqa: E402
from fairvfl_flwr.features.staleness import effective_quorum  # noqa: E402


def run(cfg: RunConfig) -> dict:
    grid = InProcessGrid(client_app, cfg.to_flower(), cfg.num_parties, async_replies=True)
    t0 = time.perf_counter()
    try:
        summary, folder = run_server(grid, cfg.to_flower())
    finally:
        grid.close()
    total = time.perf_counter() - t0
    rows = json.loads((folder / "history.json").read_text())[1:]
    behind = [int(b) for r in rows for b in (r.get("stale") or {}).values()]
    return {
        "tau": cfg.max_staleness,
        "staleness.quorum": effective_quorum(cfg) if cfg.max_staleness else cfg.num_parties,
        "rounds_seconds": rows[-1]["seconds"],
        "total_seconds": total,
        "train_deo": summary["train_deo"],
        "train_loss": summary["train_loss"],
        "test_acc": summary["test_acc"],
        "test_dfp": summary["test_dfp"],
        "test_dfn": summary["test_dfn"],
        "stale_rounds": sum(1 for r in rows if r.get("stale")),
        "max_behind": max(behind, default=0),
        "mean_behind": (sum(behind) / len(behind)) if behind else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="crime")
    ap.add_argument("--model", default="linear")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--fast", type=float, default=0.02, help="reply delay of every party (s)")
    ap.add_argument("--slow", type=float, default=0.06, help="reply delay of the slow party (s)")
    ap.add_argument("--slow-party", type=int, default=3)
    ap.add_argument("--taus", default="0,1,2,4", help="max-staleness values; 0 = synchronous")
    ap.add_argument("--quorum", type=int, default=0, help="0: num-parties - 1")
    ap.add_argument("--json", default="", help="also write the raw results here")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder of the results page async_stragglers.md")
    args = ap.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)

    delays = ",".join(f"{p}={args.slow if p == args.slow_party else args.fast}" for p in range(6))
    out_dir = tempfile.mkdtemp(prefix="async-bench-")
    base = RunConfig(dataset=args.dataset, model=args.model, epsilon=args.epsilon, num_server_rounds=args.rounds,
                     eval_every=args.eval_every, output_dir=out_dir, straggler_delays=delays, quorum=args.quorum)
    results = []
    for tau in (int(t) for t in args.taus.split(",")):
        res = run(base.replace(max_staleness=tau))
        results.append(res)
        print(f"done tau={tau}: {res['rounds_seconds']:.1f} s", file=sys.stderr, flush=True)

    print(f"\n{args.dataset} / {args.model}, eps={args.epsilon}, {args.rounds} rounds, 6 parties; reply delay "
          f"{args.fast:g} s, party {args.slow_party} {args.slow:g} s; in-process grid with async replies\n")
    head = f"{'mode':<14}{'staleness.quorum':>7}{'wall s':>9}{'ms/round':>10}{'speed-up':>9}{'train DEO':>11}{'L':>8}" \
           f"{'test ACC':>10}{'DFP':>7}{'DFN':>7}{'stale rnds':>11}{'max/mean behind':>17}"
    print(head)
    print("-" * len(head))
    sync = next((r["rounds_seconds"] for r in results if r["tau"] == 0), None)
    for r in results:
        mode = "synchronous" if r["tau"] == 0 else f"tau={r['tau']}"
        speed = f"{sync / r['rounds_seconds']:.2f}x" if sync else "-"
        print(f"{mode:<14}{r['staleness.quorum']:>7}{r['rounds_seconds']:>9.1f}{1000 * r['rounds_seconds'] / args.rounds:>10.1f}"
              f"{speed:>9}{r['train_deo']:>11.4f}{r['train_loss']:>8.4f}{100 * r['test_acc']:>9.2f}%"
              f"{r['test_dfp']:>7.3f}{r['test_dfn']:>7.3f}{r['stale_rounds']:>11}"
              f"{r['max_behind']:>9}/{r['mean_behind']:.2f}")
    payload = {"args": vars(args) | {"out": str(args.out)}, "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    rows = [{"mode": "synchronous" if r["tau"] == 0 else f"tau={r['tau']}", "quorum": r["staleness.quorum"],
             "wall s": round(r["rounds_seconds"], 1),
             "ms/round": round(1000 * r["rounds_seconds"] / args.rounds, 1),
             "speed-up": f"{sync / r['rounds_seconds']:.2f}x" if sync else "-",
             "train DEO": round(r["train_deo"], 4), "test ACC %": round(100 * r["test_acc"], 2),
             "DFP": round(r["test_dfp"], 3), "DFN": round(r["test_dfn"], 3), "stale rounds": r["stale_rounds"],
             "max/mean behind": f"{r['max_behind']}/{r['mean_behind']:.2f}"} for r in results]
    notes = (f"{args.dataset} / {args.model}, ε = {args.epsilon}, {args.rounds} rounds, 6 parties; reply delay "
             f"{args.fast:g} s, party {args.slow_party} {args.slow:g} s; in-process grid with async replies.")
    write(args.out, "async_stragglers", payload,
          table(rows, list(rows[0])), title="Stragglers: synchronous rounds against bounded staleness", notes=notes)


if __name__ == "__main__":
    main()
