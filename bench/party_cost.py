"""CPU seconds of one deployed party's ClientApp process for a training message, masked
against unmasked, by phase.

    python bench/party_cost.py [--dataset adult] [--parties 6] [--round 2] [--repeats 3] \\
        [--who 0,1] [--profile] [--keep DIR] [--out docs/results]

In a deployment every message is a fresh ``flwr-clientapp`` process per party, so what a
party does per message is paid per party per round, and on one machine the parties share
its cores. This script exports the dataset's party files (with demo identity keys and the
pinned peers file, as ``fairvfl-keys`` would make them), runs block Newton in this process
(the real ServerApp job and ClientApp on the in-process grid) masked and unmasked, and keeps
the message and the node's context (its state between messages) that party ``--who`` got in
round ``--round``, as Flower serialises them. Each is then answered in a fresh Python process,
as ``flwr-clientapp`` does, timing CPU seconds (``time.process_time``) of:

* ``flower``: Flower's own modules the ClientApp process loads before the app (the floor);
* ``decode``: the message and context from their protobufs;
* ``app import``: ``client_app`` (the package, its mods and handlers);
* one column per mod of the ClientApp (its own time, without the mods inside it) and
  ``handler`` (the algorithm's party step);
* ``encode``: the reply and the context back to protobuf;

and the message's and the reply's objects (records, arrays, array chunks): Flower moves each
in a request of its own at every hop (ServerApp, SuperLink, SuperNode, ClientApp), so an
object costs CPU in four processes that this table does not see. The process loads the
app's bytecode cached by an untimed first process (Python's default, as a SuperNode's
ClientApp processes do under tools/localfed.py) and the party's parsed file from its cache.

Masked and unmasked processes alternate, ``--repeats`` times; the table gives medians.
``--profile`` also prints, per case, the functions of the call that took the most CPU
(cProfile, one more process each). A benchmark script, not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, REPO, page_name, table, write  # noqa: E402
from fairvfl_flwr.tools.cli import parse_run_config  # noqa: E402

#: Run in the fresh process: argv[1] the case folder, argv[2] "profile" or "".
CHILD = r"""
import sys, time, json, cProfile, pstats, io
pt = time.process_time
case, profile = sys.argv[1], sys.argv[2] == "profile"
out = {"start": pt()}
t = pt()
import flwr.supernode.runtime.run_clientapp  # what flwr-clientapp has loaded before the app
from flwr.common.serde import context_from_proto, context_to_proto, message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Context as PC, Message as PM
out["flower"] = pt() - t
t = pt()
message = message_from_proto(PM.FromString(open(case + "/message.pb", "rb").read()))
context = context_from_proto(PC.FromString(open(case + "/context.pb", "rb").read()))
out["decode"] = pt() - t
t = pt()
from fairvfl_flwr.features import ckks, guards, rejoin, secagg, straggler, timing, transcripts
from fairvfl_flwr.jobs import scoring
own, inner = {}, {}
def timed(name, mod):
    def wrapper(message, context, call_next):
        def deeper(m, c):
            s = pt(); r = call_next(m, c); inner[name] = inner.get(name, 0.0) + pt() - s; return r
        s = pt(); r = mod(message, context, deeper); own[name] = own.get(name, 0.0) + pt() - s; return r
    return wrapper
MODS = ((timing, "timing_mod"), (guards, "refusal_mod"), (scoring, "settings_mod"), (secagg, "mask_mod"),
                     (guards, "guard_mod"), (ckks, "ckks_mod"), (rejoin, "rejoin_mod"),
                     (transcripts, "transcript_mod"), (straggler, "delay_mod"))
for module, attr in MODS:
    setattr(module, attr, timed(attr.removesuffix("_mod"), getattr(module, attr)))
import client_app
out["app import"] = pt() - t
t = pt()
if profile:
    prof = cProfile.Profile(pt)
    reply = prof.runcall(client_app.app, message, context)
else:
    reply = client_app.app(message, context)
out["call"] = pt() - t
assert not reply.has_error(), reply.error
names = [attr.removesuffix("_mod") for _, attr in MODS]  # outermost first
for a, b in zip(names, names[1:]):  # a mod's own time: its call less the mods inside it
    own[a] -= own[b]
own[names[-1]] -= inner[names[-1]]
out.update({f"mod {k}": own[k] for k in names})
out["handler"] = inner[names[-1]]
t = pt()
sizes = (len(message_to_proto(reply).SerializeToString()), len(context_to_proto(context).SerializeToString()))
out["encode"] = pt() - t
out["total"] = pt()
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
# Flower moves each of a message's objects (records, arrays, chunks) in a request of its own, at every hop
out["objects in"], out["objects out"] = len(get_all_nested_objects(message)), len(get_all_nested_objects(reply))
out["kB in"] = (len(open(case + "/message.pb", "rb").read())) / 1e3
out["kB out"], out["kB context"] = sizes[0] / 1e3, sizes[1] / 1e3
if profile:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
    out["profile"] = s.getvalue()
print(json.dumps(out))
"""


def capture(folder: Path, dataset: str, parties: int, rounds: int, round_: int, who: list[int],
            extra: dict | None = None) -> dict[str, Path]:
    """Run block Newton in this process masked and unmasked on exported party files; keep,
    per case, the message and context party ``who`` received in round ``round_``."""
    import os

    os.environ["FAIRVFL_CACHE_DIR"] = str(folder / "cache")  # the party's parsed file, warm after round 0
    from flwr.common.serde import context_to_proto, message_to_proto

    from fairvfl_flwr.app.client import app as client_app
    from fairvfl_flwr.app.run import run_inprocess
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.flower.inprocess import InProcessGrid
    from fairvfl_flwr.tools.export import export

    base = {"dataset": dataset, "num-parties": parties, "optimizer": "newton", "stop-tolerance": 0,
            "num-server-rounds": rounds, "eval-every": rounds, **(extra or {})}
    cases = {}
    for masked in (True, False):
        manifest = export(RunConfig.from_flower(base), folder / f"export-{int(masked)}", demo_keys=True,
                          secure_aggregation=masked)
        # unmasked: nodes without identity keys, whose operators accept unmasked runs
        nodes = manifest["node_configs"] if masked else [
            {**{k: v for k, v in n.items() if k not in ("identity-key", "peers")}, "allow-unmasked": True}
            for n in manifest["node_configs"]]
        run_config = {**base, **manifest["run_config"], "output-dir": str(folder / "runs")}
        kept = {}

        class Capturing(InProcessGrid):
            def _answer(self, msg):
                context = self.contexts[msg.metadata.dst_node_id]
                pid = int(context.node_config["partition-id"])
                if pid in who and msg.metadata.group_id == str(round_) and msg.metadata.message_type.startswith("train"):
                    kept[pid] = (message_to_proto(msg).SerializeToString(),
                                 context_to_proto(context).SerializeToString(), msg.metadata.message_type)
                return super()._answer(msg)

        settings_grid = Capturing(client_app, RunConfig.from_flower(run_config).to_flower(), parties,
                                  node_configs=nodes)
        run_inprocess(run_config, quiet=True, grid=settings_grid)
        for pid, (message, context, mtype) in kept.items():
            case = folder / f"{'masked' if masked else 'unmasked'}-{pid}"
            case.mkdir()
            (case / "message.pb").write_bytes(message)
            (case / "context.pb").write_bytes(context)
            cases[f"{'masked' if masked else 'unmasked'} {mtype.split('.')[1]} (party {pid})"] = case
    return cases


def answer(case: Path, profile: bool = False) -> dict:
    """One fresh process answering the case's message; its CPU seconds by phase."""
    import os

    # The party's parsed file is cached by the capture's run, and its bytecode by the first process
    # (Python's default, as under tools/localfed.py): warm, as after a deployed run's first message.
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
           "FAIRVFL_CACHE_DIR": str(case.parent / "cache"), "PYTHONPYCACHEPREFIX": str(case.parent / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(case), "profile" if profile else ""], cwd=case,
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{case}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="adult")
    ap.add_argument("--parties", type=int, default=6)
    ap.add_argument("--round", type=int, default=2, help="the training round whose message is timed (>= 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--who", default="0,1", help="partition ids of the parties timed")
    ap.add_argument("--run-config", default="", help="extra run config (Flower's syntax) of the captured run, "
                    "e.g. \"model='mlp'\"")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--keep", type=Path, help="keep the captured messages here; an earlier capture there is reused")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--name", type=page_name, default="party-cost", help="the results page's name")
    args = ap.parse_args(argv)
    extra = parse_run_config(args.run_config, "--run-config")
    with tempfile.TemporaryDirectory(prefix="party-cost-") as tmp:
        folder = args.keep or Path(tmp)
        index = folder / "cases.json"
        if index.exists():
            cases = {name: Path(p) for name, p in json.loads(index.read_text()).items()}
        else:
            folder.mkdir(parents=True, exist_ok=True)
            cases = capture(folder, args.dataset, args.parties, args.round + 1, args.round,
                            [int(w) for w in args.who.split(",")], extra)
            index.write_text(json.dumps({name: str(p) for name, p in cases.items()}))
        runs: dict[str, list[dict]] = {name: [] for name in cases}
        for case in cases.values():  # writes the bytecode of every module the process loads
            answer(case)
        for _ in range(args.repeats):
            for name, case in cases.items():
                runs[name].append(answer(case))
        if args.profile:
            for name, case in cases.items():
                print(f"== {name}: cProfile of the call (process CPU seconds)\n{answer(case, True)['profile']}")
    first = runs[next(iter(runs))][0]
    phases = [k for k in first if k not in ("start", "call", "total", "profile") and not k.startswith(("kB", "objects"))] + ["total"]
    phases += [k for k in first if k.startswith(("kB", "objects"))]
    rows = [{"message": name, **{p: statistics.median(r[p] for r in rs) for p in phases}} for name, rs in runs.items()]
    md = table(rows, ["message", *phases])
    notes = (f"{args.dataset}, {args.parties} parties, block Newton"
             f"{', run config ' + args.run_config if args.run_config else ''}, round {args.round}'s training message; CPU "
             "seconds (user + system) of one fresh process per message, median of "
             f"{args.repeats}; `start` (the interpreter before any import) is in `total`. A mod's column is its own "
             "time, without the mods inside it.")
    write(args.out, args.name, {"rows": rows, "runs": runs}, md, title="A deployed party's CPU per message",
          notes=notes)
    return {"rows": rows}


if __name__ == "__main__":
    main()
