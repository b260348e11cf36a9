"""Encrypted ν (``privacy.secure-nu = "ckks"``): cost per round against plain, both in this one run.

    python bench/ckks.py [--dataset adult] [--rounds 10] [--reps 3] [--optimizer gd] [--out docs/results]

The real ServerApp strategy and ClientApp over the in-process grid, the default run
config (6 parties, 5 of them passive, linear, float32 wire) with ``--optimizer``, plain
and CKKS runs alternated ``--reps`` times each so that load drifts hit both alike.
ms/round is the mean over rounds 2..R of each run (round 1 excluded: a party encodes
its columns there, once, reported apart); the minimum and the median over reps are reported with their
ratios, and the CPU time per round of this process, which holds the server and every
party, over rounds 2..R-1 (other users' load moves it far less than wall time).

Where a CKKS round's time goes: the functions of features/ckks.py are timed in place
(CPU time, summed over the last rep's rounds, per round): the server encrypting ν, a party's
products and masks (loading ν's ciphertexts apart), the server decrypting the masked
sums, SEAL (de)serialisation; and once, in round 1, the parties encoding their columns.
Also the bytes per round each way, the test accuracy of both and max |θ_ckks − θ_plain| over
the blocks the parties saved.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# bench.common first: it sets one BLAS thread before numpy loads OpenBLAS (imported
# earlier, OpenBLAS keeps a thread per core, and on a busy machine the plain round's
# matrix products run several times slower, which flatters the ratio)
from bench.common import DEFAULT_OUT, alternated, ms_per_round, table, write  # noqa: E402

import numpy as np  # noqa: E402

#: features/ckks.py functions timed in place: name → what the row says
TIMED = {
    "passive_content": "server: encode + encrypt Enc(n·ν) (once a round)",
    "_ciphertext": "load a ciphertext (parties: ν chunks; server: masked pairs)",
    "masked_column_sums": "parties: products, masks (incl. loading ν)",
    "_encoded_block": "parties: look up / encode their columns",
    "masked_sums": "server: load + decrypt + decode the masked pairs",
    "_dump": "serialise (server: ν chunks; parties: masked pairs)",
}


def _theta_gap(plain: Path, enc: Path) -> float:
    """max |θ_ckks − θ_plain| over every party's saved block (the same rounds and seed)."""
    gap = 0.0
    for a in sorted(Path(plain).glob("*/parties/partition-*/block.npz")):
        (b,) = Path(enc).glob(f"*/parties/{a.parent.name}/block.npz")
        with np.load(a) as x, np.load(b) as y:
            gap = max(gap, *(float(np.max(np.abs(x[k].astype(np.float64) - y[k]))) for k in x.files))
    return gap


class Timers:
    """Wraps module functions so that each call adds its CPU time to a bucket (this process
    runs the server and every party one after another, so CPU time is each step's own)."""

    def __init__(self, module, names) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        for name in names:  # (an older features/ckks.py lacks some: those rows stay 0)
            if hasattr(module, name):
                setattr(module, name, self._wrap(name, getattr(module, name)))
        self.server_cls = getattr(module, "CkksServer")
        for name in ("passive_content", "masked_sums"):
            setattr(self.server_cls, name, self._wrap(name, getattr(self.server_cls, name)))

    def _wrap(self, name, fn):
        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.process_time() - t0
                self.calls[name] += 1
        return timed

    def reset(self) -> None:
        self.totals.clear()
        self.calls.clear()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--optimizer", default="gd", choices=["gd", "newton"])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)

    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.features import ckks

    timers = Timers(ckks, ["_ciphertext", "masked_column_sums", "_encoded_block", "_dump"])
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    accs: dict[bool, float] = {}
    breakdown: dict[str, float] = {}
    calls: dict[str, float] = {}
    gaps: list[float] = []
    once = 0.0
    servers = []
    orig_init = ckks.CkksServer.__init__

    def keep(self, *a, **kw):  # the bytes counters of each run's key owner
        orig_init(self, *a, **kw)
        servers.append(self)
    ckks.CkksServer.__init__ = keep
    with tempfile.TemporaryDirectory() as tmp:
        for rep, on, out, rounds in alternated(args.reps, args.rounds, tmp):
            cfg = RunConfig.from_flower({**RunConfig().to_flower(), "dataset": args.dataset,
                                         "optimizer": args.optimizer, "stop-tolerance": 0.0,
                                         "num-server-rounds": rounds, "eval-every": rounds,
                                         "output-dir": str(out), "privacy.secure-nu": "ckks" if on else "none"})
            marks: dict[str, float] = {}

            def tap(msg, marks=marks, last=str(rounds)):  # CPU at the first message of round 2 and of round R
                if msg.metadata.group_id in ("2", last) and msg.metadata.group_id not in marks:
                    marks[msg.metadata.group_id] = time.process_time()
            timers.reset()
            summary, _ = run_inprocess(cfg.to_flower(), quiet=True, tap=tap)
            if rep < 0:
                continue
            # CPU time of this process (server and every party run in it), rounds 2..R-1
            cpu[on].append(1000 * (marks[str(rounds)] - marks["2"]) / (rounds - 2))
            wall[on].append(ms_per_round(out))
            accs[on] = summary["test_acc"]
            if on:
                gaps.append(_theta_gap(out.with_name(f"0-{rep}"), out))
                calls = {k: v / rounds for k, v in timers.calls.items()}
                once = 1000 * timers.totals.get("_encoded_block", 0.0)  # round 1's encoding; later look-ups ~µs
                breakdown = {k: 1000 * v / rounds for k, v in timers.totals.items()}
                breakdown["masked_column_sums"] -= once / rounds
                breakdown["_encoded_block"] = 0.0
            print(f"rep {rep} secure-nu={'ckks' if on else 'none'}: {wall[on][-1]:.1f} ms/round wall, "
                  f"{cpu[on][-1]:.1f} ms/round CPU", flush=True)
    ckks.CkksServer.__init__ = orig_init
    last = servers[-1]
    n_parties_passive = 5
    bytes_out = (last.bytes_sent - n_parties_passive * len(last.public)) / args.rounds  # less the parameters
    bytes_back = last.bytes_received / args.rounds

    def stats(on: bool) -> tuple[float, float]:
        return float(np.min(wall[on])), float(np.median(wall[on]))

    (plain_min, plain_med), (enc_min, enc_med) = stats(False), stats(True)
    rows = [
        {"ν to passive parties": "plain", "CPU ms/round (median)": float(np.median(cpu[False])),
         "ms/round (min)": plain_min, "ms/round (median)": plain_med, "test ACC": accs[False]},
        {"ν to passive parties": "ckks", "CPU ms/round (median)": float(np.median(cpu[True])),
         "ms/round (min)": enc_min, "ms/round (median)": enc_med, "test ACC": accs[True]},
    ]
    parts = [{"step": TIMED[k], "CPU ms/round": breakdown.get(k, 0.0), "calls/round": calls.get(k, 0.0)}
             for k in TIMED if k != "_encoded_block"]
    md = (f"Encrypted ν vs plain, {args.dataset}, optimizer={args.optimizer}, {args.rounds} rounds x {args.reps} reps "
          "each, in-process grid (the 6 parties run one after another in one process)\n\n"
          + table(rows, ["ν to passive parties", "CPU ms/round (median)", "ms/round (min)", "ms/round (median)",
                         "test ACC"])
          + f"\n\nmax |θ_ckks − θ_plain| over the saved blocks: {max(gaps):.2g} (worst rep)"
          + f"\n\nratio (ckks / plain): CPU per round {np.median(cpu[True]) / np.median(cpu[False]):.2f}; "
          f"wall per round min {enc_min / plain_min:.2f}, median {enc_med / plain_med:.2f}\n\n"
          f"Where a CKKS round goes (last rep, all {args.rounds} rounds, the parties' one-time encoding apart; nested "
          "rows overlap: the parties' products include their loads and serialisation, the server's decryption its "
          "loads, its encryption its serialisation)\n\n"
          + table(parts, ["step", "CPU ms/round", "calls/round"])
          + f"\n\nonce, round 1: the parties encoding their columns {once:.0f} ms CPU in all"
          + f"\nbytes per round: Enc(ν) to the passive parties {bytes_out / 1e6:.2f} MB, masked ciphertexts back "
          f"{bytes_back / 1e6:.2f} MB; parameters once {len(last.public)} B per passive party")
    payload = {"dataset": args.dataset, "optimizer": args.optimizer, "rounds": args.rounds, "reps": args.reps,
               "ms_per_round": {"plain": wall[False], "ckks": wall[True]},
               "cpu_ms_per_round": {"plain": cpu[False], "ckks": cpu[True]},
               "ratio_cpu": float(np.median(cpu[True]) / np.median(cpu[False])),
               "ratio_min": enc_min / plain_min, "ratio_median": enc_med / plain_med,
               "breakdown_ms_per_round": breakdown, "encode_columns_ms": once,
               "bytes_to_passive_per_round": bytes_out, "bytes_back_per_round": bytes_back,
               "test_acc": {"plain": accs[False], "ckks": accs[True]}, "max_theta_gap": max(gaps)}
    write(args.out, f"ckks-{args.dataset}-{args.optimizer}", payload, md, title="Encrypted ν (CKKS): cost per round")
    return payload


if __name__ == "__main__":
    main()
