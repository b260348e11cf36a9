"""A registry in a loopback deployment: five SuperNodes, own tables, masked, encrypted groups against the label owner's.

    python bench/registry_deploy.py [--rows 4000] [--epsilon 0.05] [--rounds 200] [--page]

Five organisations' raw tables cut from Adult (tools/owntables.py: each its own id column,
a different 85-95 % of the people, shuffled): the label owner (age, workclass, education,
income), three feature holders, and a registry that holds sex beside native-country. Each
party gets its own identity key and the pinned peers file; the run config is ``tables.own =
true`` (so: PSI alignment, secure aggregation), ``groups.holder = "registry"`` and
``groups.release = "ckks"``: the registry's groups stay under its CKKS key, the server gets
sums over them, and every party's gradient goes through ν under that key.

Beside it, in the same process, the same people and columns with sex on the label owner's
table instead (no registry: four feature holders), under the same run config but the two
groups keys. Both under ``optimizer = "auto"`` (block Newton for both: on encrypted groups
its search models the gaps from the registry's sums, docs/newton.md), both evaluated every round. The table gives each
deployment's seconds from ``flwr run`` to its summary, its rounds, the round from which
every training gap stays within ε (DEO's loss gaps), and its test accuracy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import DEFAULT_OUT, table, write  # noqa: E402
from bench.deploy_time import deploy, history  # noqa: E402
from bench.rounds import GAP_SLACK, rounds_to_gaps  # noqa: E402
from fairvfl_flwr.secure import identity  # noqa: E402
from fairvfl_flwr.tools import owntables  # noqa: E402

#: The registry's deployment: the label owner's, three feature holders' and the registry's columns.
REGISTRY_COLUMNS = [["age", "workclass", "education", "income"], ["fnlwgt", "education-num", "marital-status",
                    "occupation"], ["capital-gain", "capital-loss", "relationship"], ["hours-per-week", "race"],
                    ["native-country", "sex"]]
#: The label owner's deployment: the same, sex on the label owner's table.
OWNER_COLUMNS = [["age", "workclass", "education", "sex", "income"], *REGISTRY_COLUMNS[1:4], ["native-country"]]
ID_NAMES = [*owntables.ID_NAMES, "registry_id"]
GROUPS = {"sensitive-column": "sex", "group-a": "Female", "group-b": "Male"}


def federation(folder: Path, raw, registry: bool, keys: list[dict]) -> list[dict]:
    """The five parties' tables under ``folder`` and their node configs."""
    folder.mkdir(parents=True, exist_ok=True)
    owntables.write_own_tables(raw, folder, seed=1, columns=REGISTRY_COLUMNS if registry else OWNER_COLUMNS,
                               id_names=ID_NAMES)
    owner = {k: v for k, v in owntables.LABEL_OWNER.items() if k not in GROUPS} if registry else owntables.LABEL_OWNER
    nodes = [owntables.own_node(k, folder / f"party{k}.csv", ID_NAMES[k], owner, **keys[k]) for k in range(5)]
    if registry:
        nodes[4].update(role="registry", **GROUPS)
    return nodes


def run(tmp: Path, slug: str, name: str, nodes: list[dict], cfg: dict, epsilon: float) -> dict:
    out = tmp / f"out-{slug}"
    got = deploy(tmp / f"fed-{slug}", nodes, {**cfg, "output-dir": str(out)}, {})
    if got["status"] != "finished:completed":
        print(got["log_tail"], file=sys.stderr)
        raise SystemExit(f"the {name} deployment ended {got['status']}")
    (summary_path,) = out.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    rows = history(out)
    return {"groups held by": name, "optimizer": summary.get("optimizer", cfg.get("optimizer", "auto")),
            "rounds": summary["rounds"], "to ε": rounds_to_gaps(rows, epsilon),
            "train max gap": summary["train_max_gap"], "test acc": 100 * summary["test_acc"],
            "seconds to summary": summary_path.stat().st_mtime - got["submitted"],
            "seconds": got["finished"] - got["submitted"]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4000, help="people drawn from Adult")
    ap.add_argument("--epsilon", type=float, default=0.05, help="the DEO loss gaps' bound")
    ap.add_argument("--rounds", type=int, default=200, help="a cap on each run's rounds (the stop rule ends sooner)")
    ap.add_argument("--page", action="store_true", help="publish docs/results/privacy/registry-deploy.md")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    raw = owntables.adult_raw(a.rows, 0)
    cfg = {"tables.own": True, "num-parties": 5, "dataset": "adult", "epsilon": a.epsilon,
           "num-server-rounds": a.rounds, "eval-every": 1}
    rows = []
    with tempfile.TemporaryDirectory(prefix="registry-deploy-") as tmp:
        tmp = Path(tmp)
        keys = identity.generate_identities(tmp / "identities", 5)
        started = time.time()
        rows.append(run(tmp, "owner", "label owner", federation(tmp / "owner", raw, False, keys), cfg, a.epsilon))
        rows.append(run(tmp, "registry", "registry (encrypted)", federation(tmp / "registry", raw, True, keys),
                        {**cfg, "groups.holder": "registry", "groups.release": "ckks"}, a.epsilon))
        print(f"both deployments in {time.time() - started:.0f} s")
    owner, reg = rows
    for r in rows:
        r["time vs label owner"] = r["seconds to summary"] / owner["seconds to summary"]
    cols = list(rows[0])
    md = table(rows, cols)
    notes = (f"{a.rows} people drawn from Adult (seed 0), five parties' own tables (each 85-95 % of them, "
             f"shuffled, its own id column), ε = {a.epsilon} on DEO's loss gaps, evaluated every round; each run "
             "in a fresh loopback federation (a SuperLink and five SuperNodes on this machine), identity keys "
             "pinned, PSI alignment, secure aggregation of the logits. `to ε`: the first round from which every "
             f"training gap stays within ε + {GAP_SLACK} (None: not at the end); `seconds to summary`: from `flwr run` to the "
             "run's summary file; `time vs label owner`: the same, over the label owner's deployment in this run. "
             "Both runs take what `optimizer = \"auto\"` picks (the summary's `optimizer` column).")
    payload = {"rows": rows, "settings": {"rows": a.rows, "epsilon": a.epsilon, "rounds": a.rounds}}
    if a.page:
        write(a.out, "registry-deploy", payload, md, title="A registry in a loopback deployment: encrypted groups "
              "against the label owner's", notes=notes)
    else:
        print(md)
    return payload


if __name__ == "__main__":
    main()
