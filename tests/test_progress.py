"""The time left of a job whose steps cost differently (flower/progress.py), on a made-up
sequence shaped like a private alignment of 6 parties' 200,000 ids on one 2-core machine."""

from __future__ import annotations

import logging
import time

import pytest

from fairvfl_flwr.flower.progress import RECORD, Estimate, Progress, Step

N, K, CORES = 200_000, 6, 2
#: (step, kind, units, true seconds): reading the tables, every party blinding (its work adds up
#: on the 2 cores), the other parties raising the label owner's ids, the label owner alone
#: raising each party's list, the parties' preparation. A raise costs 0.75 of a blinding here,
#: the model says 0.7; preparing a row costs 2/3 of reading one, the model says 1/2.
TRUE = [
    ("size", "read", K * N, 2.0),
    ("blind", "blind", K * N / CORES, K * N / CORES * 100e-6),
    ("raise", "raise", (K - 1) * N / CORES, (K - 1) * N / CORES * 75e-6),
    *[(f"intersect {k}", "raise", N / CORES, N / CORES * 75e-6) for k in range(1, K)],
    ("finish", "prepare", (K - 1) * 0.9 * N, (K - 1) * 0.9 * N * 2.0 / (K * N) * 2 / 3),
]
RELATIVE = {"raise": ("blind", 0.7), "prepare": ("read", 0.5)}


def truth_left(done: int) -> float:
    return sum(seconds for *_, seconds in TRUE[done:])


def naive_per_id(done: int) -> float:
    """The server's earlier estimate: the last step's seconds per id of the largest list, times
    the ids every later step handles, as if each cost the same per id and ran alone."""
    _, _, _, seconds = TRUE[done - 1]
    per_id = seconds / N
    ids_left = {"blind": K * N, "raise": (K - 1) * N}
    return per_id * sum(ids_left.get(kind, N) for _, kind, _, _ in TRUE[done:] if kind in ("blind", "raise"))


def naive_per_step(done: int) -> float:
    """Steps counted as equals: the seconds so far per step, times the steps left."""
    elapsed = sum(s for *_, s in TRUE[:done])
    return elapsed / done * (len(TRUE) - done)


def test_the_time_left_is_within_a_factor_1_5_once_a_fifth_is_done_where_counting_steps_or_ids_alike_is_off_2x():
    estimate = Estimate([Step(name, kind, units) for name, kind, units, _ in TRUE], relative=RELATIVE)
    total = truth_left(0)
    checked = 0
    for done, (_, _, _, seconds) in enumerate(TRUE, 1):
        estimate.finished(seconds)
        if total - truth_left(done) < 0.2 * total or done == len(TRUE):
            continue
        ours, truth = estimate.left(), truth_left(done)
        assert 1 / 1.5 <= ours / truth <= 1.5, (TRUE[done - 1][0], ours, truth)
        checked += 1
        if checked == 1:  # the first step done past a fifth of the time: the naive ones are off by 2x or more
            for naive in (naive_per_id(done), naive_per_step(done)):
                assert naive / truth >= 2 or naive / truth <= 0.5, (naive, truth)
    assert checked == len(TRUE) - 2


def test_halfway_through_a_first_blinding_five_times_slower_than_a_free_cores_cost_the_time_left_is_within_1_5x():
    """On a busy machine the prior (the library's cost on a free core) is short by any factor;
    past it, the step is taken to be half done, and the steps tied to it follow."""
    estimate = Estimate([Step(name, kind, units) for name, kind, units, _ in TRUE], relative=RELATIVE,
                        priors={"blind": 100e-6 / 5, "raise": 75e-6 / 5})
    estimate.finished(TRUE[0][3])
    blinding = TRUE[1][3]
    for share in (0.4, 0.5, 0.6):  # of the blinding
        ours, truth = estimate.left(elapsed=share * blinding), truth_left(1) - share * blinding
        assert 1 / 1.5 <= ours / truth <= 1.5, (share, ours, truth)


def test_a_kind_not_seen_yet_takes_its_prior_and_the_step_under_way_its_own_pace():
    estimate = Estimate([Step("a", "blind", 100), Step("b", "raise", 100)], priors={"blind": 1.0},
                        relative=RELATIVE)
    assert estimate.left() == pytest.approx(100 + 70)  # raise tied to blind's prior
    assert estimate.left(elapsed=30, done_units=60) == pytest.approx(20 + 0.7 * 0.5 * 100)  # its own pace: 0.5 s a unit
    assert estimate.left(elapsed=150) == pytest.approx(150 + 0.7 * 3.0 * 100)  # past its prior: taken to be half done
    assert Estimate([Step("a", "blind", 100)]).left() is None  # no measure, no prior: not known yet
    estimate.finished(200.0)
    assert estimate.left() == pytest.approx(0.7 * 2.0 * 100)  # measured blinding beats the prior
    assert estimate.left(elapsed=150) == 0  # past a measured estimate (140 s): at least what it took
    estimate.plan([Step("b", "raise", 10), Step("c", None)])  # a step of no kind is not estimated
    assert estimate.left() == pytest.approx(0.7 * 2.0 * 10)


def test_the_log_names_each_step_with_its_counts_and_time_left_and_what_a_running_step_waits_for(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    now = [100.0]  # the job's clock: 20 s go by in the first step
    estimate = Estimate([Step("every party blinded its ids", "blind", 10, counts="6 x 10 ids",
                              doing="waiting for the parties to blind their ids"),
                         Step("the others raised them", "raise", 20)], relative=RELATIVE)
    progress = Progress("private alignment", estimate, clock=lambda: now[0], every=0.02)
    with progress.step(expected=6) as step:
        step.replied()
        time.sleep(0.1)
        now[0] += 20.0
        step.found = "nothing odd"
    lines = [r.getMessage() for r in caplog.records]
    assert any("step 1/2: waiting for the parties to blind their ids (6 x 10 ids), 1 of 6 replied: 0 s so far; "
               "the time left is not known yet" in line for line in lines), lines
    assert lines[-1] == ("FairVFL: private alignment, step 1/2: every party blinded its ids (6 x 10 ids); nothing odd "
                         "(20.0 s); about 28 s left"), lines  # 20 raise units at 0.7 of 2 s a blinding unit
    assert getattr(caplog.records[-1], RECORD) == {"what": "private alignment", "at": 120.0, "left": pytest.approx(28.0)}
