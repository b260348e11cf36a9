"""Own tables cut from the packaged Adult table, as separate organisations would hold them.

Benchmarks and one-machine trials of ``tables.own = true`` need what a consortium has: each
party's raw table with its own id column name, its own columns, raw text categories, and a
different 85-95 % of the people, shuffled. This module makes them from ``adult.csv.gz`` and
writes each party's node config (the label owner's names its label and groups).
"""

from __future__ import annotations

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
