"""Own tables cut from the packaged Adult table, as separate organisations would hold them.

    python -m fairvfl_flwr.tools.owntables --out /tmp/orgs [--rows 4000] [--sensitive sex,race]

Benchmarks and one-machine trials of ``tables.own = true`` need what a consortium has: each
party's raw table with its own id column name, its own columns, raw text categories, and a
different 85-95 % of the people, shuffled. This module makes them from ``adult.csv.gz`` and
gives each party's node config (the label owner's names its label and groups); the command
writes the tables and prints each party's ``--node-config`` text, to which each party adds its
own ``identity-key`` and ``peers`` (docs/deploy.md, section 0).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from fairvfl_flwr.data.tables import packaged_file

ID = "customer"
NUMBERS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
CATEGORIES = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "native-country"]
#: Each party's raw columns (the label owner also holds income and sex), in the joint table's order.
PARTY_COLUMNS = [
    ["age", "workclass", "education", "sex", "income"],
    ["fnlwgt", "education-num", "marital-status", "occupation"],
    ["capital-gain", "capital-loss", "relationship", "race"],
    ["hours-per-week", "native-country"],
]
#: Each organisation's name for its id column.
ID_NAMES = ["customer", "kundennummer", "policy holder", "client_no"]
#: The label owner's node config keys on these tables (its label and two groups by sex).
LABEL_OWNER = {"label-column": "income", "label-positive": ">50K", "sensitive-column": "sex", "group-a": "Female",
               "group-b": "Male", "protected-label": 1}


def adult_raw(rows: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Adult as raw columns (categories as strings), ids as text; ``rows`` rows drawn at random
    (None: all 48,842)."""
    df = pd.read_csv(packaged_file("adult.csv.gz"))
    if rows is not None:
        df = df.iloc[np.sort(np.random.default_rng(seed).choice(len(df), rows, replace=False))]
    out = pd.DataFrame({ID: [f"C{i:06d}" for i in df["row_id"]]})
    for c in NUMBERS:
        out[c] = df[c].to_numpy()
    for c in CATEGORIES:
        dummies = [k for k in df.columns if k.startswith(c + "_")]
        out[c] = np.asarray([k[len(c) + 1:] for k in dummies])[df[dummies].to_numpy().argmax(axis=1)]
    out["sex"] = df["sex"].to_numpy()
    out["income"] = df["income"].to_numpy()
    return out


def write_own_tables(raw: pd.DataFrame, folder: Path, seed: int = 1, columns: list[list[str]] = PARTY_COLUMNS,
                     id_names: list[str] | None = None) -> list[set]:
    """Party k's file ``party<k>.csv``: a different 85-95 % subset of the ids, shuffled, only its
    own columns (``columns[k]``), its id column named ``id_names[k]`` (default: ``customer``).
    Returns the ids each party holds."""
    rng = np.random.default_rng(seed)
    held = []
    for k, cols in enumerate(columns):
        share = rng.uniform(0.85, 0.95)
        rows = rng.permutation(len(raw))[: int(share * len(raw))]
        table = raw.iloc[rows][[ID, *cols]]
        if id_names is not None:
            table = table.rename(columns={ID: id_names[k]})
        table.to_csv(Path(folder) / f"party{k}.csv", index=False)
        held.append(set(raw[ID].iloc[rows]))
    return held


def own_node(k: int, path, id_name: str, label_owner: dict = LABEL_OWNER, **extra) -> dict:
    """Party ``k``'s node config for its own table at ``path`` (party 0, the label owner, also
    names its label and groups: ``label_owner``)."""
    return {"partition-id": k, "table-path": str(path), "id-column": id_name, "role": "active" if k == 0 else "passive",
            **(label_owner if k == 0 else {}), **extra}


def organisations(folder: Path, sensitive: str = "sex", rows: int | None = None, seed: int = 1) -> list[dict]:
    """Four organisations' tables written under ``folder`` (``party<k>.csv``, each with its own id
    column name) and their node configs. ``sensitive``: the label owner's sensitive column(s);
    other than ``sex`` (e.g. ``sex,race``), those columns move to the label owner and every
    combination of their values is a group."""
    columns = [list(c) for c in PARTY_COLUMNS]
    label_owner = dict(LABEL_OWNER)
    if sensitive != "sex":
        for name in sensitive.split(","):
            if not any(name in cols for cols in columns):
                raise SystemExit(f"--sensitive: {name!r} is not a column of these tables ({', '.join(sum(columns, []))})")
            for cols in columns[1:]:
                if name in cols:
                    cols.remove(name)
                    columns[0].insert(-1, name)
        label_owner = {k: v for k, v in label_owner.items() if k not in ("group-a", "group-b")}
        label_owner["sensitive-column"] = sensitive
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_own_tables(adult_raw(rows), folder, seed=seed, columns=columns, id_names=ID_NAMES)
    return [own_node(k, folder / f"party{k}.csv", ID_NAMES[k], label_owner) for k in range(len(columns))]


def node_config_text(node: dict) -> str:
    """A node config as ``flower-supernode --node-config`` takes it."""
    return " ".join(f"{k}={v}" if isinstance(v, int) else f'{k}="{v}"' for k, v in node.items())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for party0.csv .. party3.csv")
    ap.add_argument("--rows", type=int, default=None, help="people drawn from Adult (default: all 45,222)")
    ap.add_argument("--sensitive", default="sex", help="the label owner's sensitive column(s), e.g. sex,race")
    a = ap.parse_args(argv)
    for node in organisations(a.out, a.sensitive, a.rows):
        print(f"party {node['partition-id']}: --node-config '{node_config_text(node)}'")


if __name__ == "__main__":
    main()
