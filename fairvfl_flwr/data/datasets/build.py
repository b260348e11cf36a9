"""Rebuild the packaged dataset copies from the raw tables in ``shared/data``.

Run from the repository root::

    python -m fairvfl_flwr.data.datasets.build --raw ../shared/data

Each output keeps only the columns FairVFL uses, plus a ``row_id`` column, so the
package stays small and ``flwr run .`` works offline. ``PROVENANCE.md`` next to this
file says where each table comes from and under which licence.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent


def build_adult(raw: Path) -> pd.DataFrame:
    """104 pre-encoded features, ``sex`` (Female/Male) and ``income`` (>50K/<=50K)."""
    df = pd.read_csv(raw / "adult.csv.gz")
    features = [c for c in df.columns if not c.startswith("salary_")]
    out = df[features].copy()
    out["sex"] = np.where(df["sex_Female"] == 1, "Female", "Male")
    out["income"] = np.where(df["salary_>50K"] == 1, ">50K", "<=50K")
    return out


PAPER_RACES = ["African-American", "Caucasian"]


def build_compas(raw: Path, races: list[str] | None = PAPER_RACES) -> pd.DataFrame:
    """ProPublica filters, African-American vs Caucasian (the paper), 26 features; ``races=None``
    keeps every race (6 values, 6,172 rows) with a one-hot column for each (30 features)."""
    df = pd.read_csv(raw / "compas-scores-two-years.csv.gz")
    df = df[
        (df["days_b_screening_arrest"].abs() <= 30)
        & (df["is_recid"] != -1)
        & (df["c_charge_degree"] != "O")
        & (df["score_text"] != "N/A")
        & (df["race"].isin(races) if races else True)
    ].reset_index(drop=True)
    jail_days = (
        pd.to_datetime(df["c_jail_out"]) - pd.to_datetime(df["c_jail_in"])
    ).dt.total_seconds() / 86400.0
    out = pd.DataFrame(
        {
            "age": df["age"],
            "juv_fel_count": df["juv_fel_count"],
            "juv_misd_count": df["juv_misd_count"],
            "juv_other_count": df["juv_other_count"],
            "priors_count": df["priors_count"],
            "days_b_screening_arrest": df["days_b_screening_arrest"],
            "c_days_from_compas": df["c_days_from_compas"],
            "jail_days": jail_days.round(3),
            "decile_score": df["decile_score"],
            "v_decile_score": df["v_decile_score"],
            "charge_drug": df["c_charge_desc"]
            .fillna("")
            .str.contains("Possess|Cocaine|Cannabis|Deliver|Drug|Heroin", case=False)
            .astype(int),
        }
    )
    onehots = {
        "sex": ["Female", "Male"],
        "age_cat": ["Less than 25", "25 - 45", "Greater than 45"],
        "race": races or sorted(df["race"].unique()),
        "c_charge_degree": ["F", "M"],
        "score_text": ["Low", "Medium", "High"],
        "v_score_text": ["Low", "Medium", "High"],
    }
    for col, values in onehots.items():
        for v in values:
            out[f"{col}_{v}"] = (df[col] == v).astype(int)
    assert out.shape[1] == 24 + len(onehots["race"]), out.shape
    out["race"] = df["race"]
    out["recidivist"] = np.where(df["two_year_recid"] == 1, "yes", "no")
    return out


def build_crime(raw: Path) -> pd.DataFrame:
    """99 normalised community features; label and group columns derived as in the paper."""
    df = pd.read_csv(raw / "crime.csv.gz")
    cols = list(df.columns)
    features = cols[cols.index("population") : cols.index("LemasPctOfficDrugUn") + 1]
    assert len(features) == 99, len(features)
    out = df[features].copy()
    out["black_share"] = np.where(df["racepctblack"] > 0.06, ">0.06", "<=0.06")
    out["crime"] = np.where(df["ViolentCrimesPerPop"] > 0.375, "high", "low")
    return out


BUILDERS = {"adult": build_adult, "compas": build_compas, "compas-race": lambda raw: build_compas(raw, None),
            "crime": build_crime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    for name, build in BUILDERS.items():
        df = build(args.raw)
        df.insert(0, "row_id", np.arange(len(df)))
        path = args.out / f"{name}.csv.gz"
        df.to_csv(path, index=False, float_format="%.6g", compression={"method": "gzip", "mtime": 0})
        print(f"{path}: {len(df)} rows, {df.shape[1]} columns, {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
