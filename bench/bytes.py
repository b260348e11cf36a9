"""Bytes on the wire per round per party, against the floor of n × 4 bytes each way.

    python bench/bytes.py [--dataset adult] [--out docs/results]

Runs 3 rounds of the real ServerApp strategy and ClientApp on the in-process grid and
serialises every message the way Flower puts it on the wire (``message_to_proto``):
server → party (z and λ to the active party, ν to passive ones) and party → server
(new partial logits and two scalars), for ``wire-dtype`` float32 (the default) and
float64. Evaluation rounds add the test logits (n_test floats) to the reply; the table
reports a training round without them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402


def measure(dataset: str, wire: str, tmp: str) -> list[dict]:
    from flwr.common.serde import message_to_proto

    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.flower.inprocess import InProcessGrid
    from fairvfl_flwr.app.server import run_server

    cfg = RunConfig(dataset=dataset, num_server_rounds=3, eval_every=1000, wire_dtype=wire, output_dir=tmp)
    sent, got = [], []

    class Tapped(InProcessGrid):
        def pull_messages(self, message_ids):
            replies = list(super().pull_messages(message_ids))
            got.extend(replies)
            return replies

    grid = Tapped(client_app, cfg.to_flower(), cfg.num_parties, tap=sent.append)
    summary, _ = run_server(grid, cfg.to_flower())
    pid = {nid: int(ctx.node_config["partition-id"]) for nid, ctx in grid.contexts.items()}
    out = {}
    for m in sent:
        if m.metadata.message_type.startswith("train.") and m.metadata.group_id == "2":
            out.setdefault(pid[m.metadata.dst_node_id], {})["down"] = message_to_proto(m).ByteSize()
            out[pid[m.metadata.dst_node_id]]["type"] = m.metadata.message_type
    for m in got:
        if m.metadata.group_id == "2" and m.metadata.message_type.startswith("train."):
            out[pid[m.metadata.src_node_id]]["up"] = message_to_proto(m).ByteSize()
    return [{"wire_dtype": wire, "party": k, **v} for k, v in sorted(out.items())]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.data.problem import load_data

    n = len(load_data(RunConfig(dataset=args.dataset)).y_train)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wire in ("float32", "float64"):
            rows += measure(args.dataset, wire, tmp)
    floor = 4 * n
    for r in rows:
        r["down_x_floor"] = r["down"] / floor
        r["up_x_floor"] = r["up"] / floor
    md = (f"Bytes per training round per party, {args.dataset} n = {n} (floor n×4 = {floor:,} bytes each way)\n\n"
          + table(rows, ["wire_dtype", "party", "type", "down", "down_x_floor", "up", "up_x_floor"]))
    write(args.out, "bytes", {"dataset": args.dataset, "n": n, "floor_bytes": floor, "rows": rows}, md, title="Bytes on the wire per training round per party")
    return {"rows": rows}


if __name__ == "__main__":
    main()
