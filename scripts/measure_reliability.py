"""Measure resume equivalence and checkpoint cost over the in-process grid (docs/reliability.md).

For each setting: an uninterrupted run; the same run where one passive party stops answering
from round ``--stop`` (the run stops, naming it), then a resume with fresh parties (new node
ids, empty state: θ from their checkpoint files); report the largest difference of the final
metrics and of the per-round loss/λ between the two. Also: seconds per round with
checkpoint-every = 0 / 1 / 10.

    python scripts/measure_reliability.py --dataset crime --rounds 60 --stop 37 --every 10
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.flower.errors import PartyUnavailable

KEYS = ("train_loss", "train_deo", "test_acc", "test_dfp", "test_dfn")


class SilentFrom(InProcessGrid):
    """Messages to node ``victim`` are lost from round ``stop`` on (its SuperNode is down)."""

    def __init__(self, *a, victim: int, stop: int, **kw):
        super().__init__(*a, **kw)
        self.victim, self.stop = victim, stop

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            g = msg.metadata.group_id
            if msg.metadata.dst_node_id == self.node_ids[self.victim] and g.isdigit() and int(g) >= self.stop:
                msg.metadata.__dict__["_message_id"] = f"lost-{id(msg)}"
                ids.append(msg.metadata.message_id)
            else:
                ids += list(super().push_messages([msg]))
        return ids


def run(rc, grid_cls=InProcessGrid, seed=0, **kw):
    grid = grid_cls(client_app, rc, rc["num-parties"], seed=seed, **kw)
    return run_server(grid, rc)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="crime")
    p.add_argument("--model", default="linear")
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--stop", type=int, default=37, help="round in which party 3 stops answering")
    p.add_argument("--every", type=int, default=10, help="reliability.checkpoint-every")
    args = p.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="fairvfl-rel-"))
    base = RunConfig.from_flower({
        "dataset": args.dataset, "model": args.model, "num-server-rounds": args.rounds, "eval-every": 10,
        "reliability.round-timeout": 0.5, "reliability.round-retries": 1, "reliability.checkpoint-dir": str(tmp / "party-disks"),
    }).to_flower()

    timings = {}
    for every in (0, 1, args.every):
        rc = {**base, "reliability.checkpoint-every": every, "output-dir": str(tmp / f"full-{every}")}
        t = time.perf_counter()
        summary, folder = run(rc)
        timings[every] = (time.perf_counter() - t) / args.rounds
        if every == 0:
            full, full_hist = summary, json.loads((folder / "history.json").read_text())

    rc = {**base, "reliability.checkpoint-every": args.every, "output-dir": str(tmp / "cut")}
    try:
        run(rc, SilentFrom, victim=3, stop=args.stop)
        raise SystemExit("the run did not stop")
    except PartyUnavailable as exc:
        stopped = str(exc)
    (folder,) = (tmp / "cut").iterdir()
    resumed_rc = {**rc, "reliability.resume-from": str(folder)}
    summary, _ = run(resumed_rc, seed=1)
    hist = json.loads((folder / "history.json").read_text())
    d_final = max(abs(summary[k] - full[k]) for k in KEYS)
    d_hist = max(max(abs(a["loss"] - b["loss"]), max(abs(x - y) for x, y in zip(a["lambdas"], b["lambdas"])))
                 for a, b in zip(hist, full_hist))
    print(json.dumps({
        "dataset": args.dataset, "model": args.model, "rounds": args.rounds, "stopped_in_round": args.stop,
        "checkpoint_every": args.every, "resumed_from_round": (args.stop - 1) // args.every * args.every,
        "stop_message": stopped, "max_abs_diff_final_metrics": d_final, "max_abs_diff_history_loss_lambda": d_hist,
        "final": {k: full[k] for k in KEYS},
        "ms_per_round_by_checkpoint_every": {str(k): round(1000 * v, 1) for k, v in timings.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
