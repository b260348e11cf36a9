"""bench/parity_rounds.py --table: which runs the rounds table holds, and how a row names a miss."""

from __future__ import annotations

import json


def test_the_table_covers_the_five_datasets_every_kind_and_three_seeds():
    from bench import parity_rounds as pr

    runs = pr.table_runs(list(pr.TABLE_DATASETS), list(pr.TABLE_KINDS), [0, 1, 2])
    by = {(r["dataset"], r["constraint"], r.get("constraint-form", "pairwise")) for r in runs}
    for ds in ("adult", "compas", "crime", "compas-race", "adult-sex-race"):
        assert (ds, "equalized-odds", "pairwise") in by and (ds, "demographic-parity", "pairwise") in by
    assert {(ds, "deo", "pairwise") for ds in pr.SEVERAL} <= by
    assert ("compas-race", "equalized-odds", "overall") in by
    assert all(r["optimizer"] == "auto" for r in runs) and len(runs) == 3 * len(by)
    assert all(r["pool-small-groups"] for r in runs if r["dataset"] in pr.SEVERAL)


def test_a_row_names_the_round_it_reached_epsilon_or_the_miss():
    from bench.parity_rounds import table_row

    base = {"run": {"dataset": "crime", "constraint": "demographic-parity", "seed": 1}, "optimizer": "newton",
            "measure": "rate", "rounds": 30, "gaps": 1, "train_max_gap": 0.0153, "test_acc": 81.0, "dp_diff": 0.05,
            "eo_diff": 0.1}
    assert table_row({**base, "within_from": 4})["within eps + 0.002 from"] == "round 4"
    missed = table_row({**base, "within_from": None})["within eps + 0.002 from"]
    assert missed == "missed: max gap 0.0153 > 0.012 after 30 rounds"
    json.dumps(table_row({**base, "within_from": None}))  # the page's JSON holds the rows


def test_a_run_of_some_rows_keeps_the_pages_other_rows_and_their_commit(tmp_path):
    from bench import parity_rounds as pr

    def row(ds, constraint, seed, form="pairwise", **more):
        return {"dataset": ds, "constraint": constraint, "form": form, "seed": seed, "rounds": 9, **more}

    page = {"commit": "abc1234", "rows": [row("adult", "equalized-odds", 0), row("adult", "demographic-parity", 0),
                                          row("compas-race", "equalized-odds", 0, form="overall", commit="def5678")]}
    previous = tmp_path / "parity-rounds.json"
    previous.write_text(json.dumps(page))
    runs = pr.table_runs(["adult"], ["demographic-parity"], [0, 1])
    kept = pr.kept_rows(previous, runs)
    # adult demographic parity seed 0 is rerun; the overall form is another row than the pairwise one
    assert [(r["constraint"], r["form"], r["commit"]) for r in kept] == [
        ("equalized-odds", "pairwise", "abc1234"), ("equalized-odds", "overall", "def5678")]
    assert pr.kept_rows(tmp_path / "none.json", runs) == []
    ordered = sorted([*kept, row("adult", "demographic-parity", 1)], key=pr.row_key)
    assert [(r["dataset"], r["constraint"]) for r in ordered] == [
        ("adult", "equalized-odds"), ("adult", "demographic-parity"), ("compas-race", "equalized-odds")]
