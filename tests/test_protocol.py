"""The job registry is the one source of message types and handlers: every type a party
answers is declared by exactly one job, the protocol's names are all answered, no module
registers a handler around the registry, and a type declared twice is refused."""

import importlib
import pkgutil
from collections import Counter
from pathlib import Path

import pytest

import fairvfl_flwr
from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.config import algorithms
from fairvfl_flwr.flower import jobs
from fairvfl_flwr.flower import protocol as msgs


def test_every_message_type_has_exactly_one_handler():
    counts = Counter(t for job in jobs.registered() for t in job.handlers)
    assert [t for t, n in counts.items() if n > 1] == []
    # two algorithms may share a handler (gradient descent and AdaGrad), never a type with different ones
    by_algorithms: dict[str, set] = {}
    for alg in algorithms.registered():
        for t, h in alg.handlers.items():
            by_algorithms.setdefault(t, set()).add(h)
    assert all(len(h) == 1 for h in by_algorithms.values()) and not set(counts) & set(by_algorithms)
    assert set(counts) | set(by_algorithms) == set(jobs.message_types())
    assert all(callable(jobs.handler_of(t)) for t in jobs.message_types())


def test_every_message_type_of_the_protocol_is_answered_by_a_job_of_the_app():
    # the protocol names only the types several layers send or read; the rest are named where their
    # handlers are declared, and every answered type has a declared kind (tests/test_message_kinds.py)
    constants = {v for k, v in vars(msgs).items()
                 if k.isupper() and isinstance(v, str) and v.startswith(("query.", "train."))}
    answered = set(jobs.message_types())
    assert constants <= answered, constants - answered
    assert all(msgs.kind_of(t) is not None for t in answered)


def test_a_job_declares_its_types_where_it_lives():
    from fairvfl_flwr.jobs import alignment, group_release, saving, scoring

    for module, types in ((alignment, alignment.ALIGN_STEPS), (saving, (saving.SAVE,)),
                          (scoring, (scoring.SCORE_INFO, scoring.SCORE)), (group_release, (group_release.GROUPS_RELEASE,))):
        assert set(types) <= set(module.JOB.handlers) and all(msgs.kind_of(t) is not None for t in types)
        named = {v for v in vars(msgs).values() if isinstance(v, str)}
        assert not set(types) & named, f"{module.__name__}'s types are named in the protocol"


def test_the_client_app_routes_every_registered_type():
    routed = set(client_app._registered_funcs)  # Flower's table of "<category>.<action>" handlers
    assert set(jobs.message_types()) <= routed


def test_a_message_type_another_job_declares_or_a_malformed_one_is_refused():
    before = jobs.registered()
    with pytest.raises(ValueError, match=r"message type 'query.info' is job 'training'"):
        jobs.register(jobs.Job("twice", {msgs.INFO: lambda message, context: message}))
    with pytest.raises(ValueError, match=r"message type 'nope' is not '<query\|train>.<name>'"):
        jobs.register(jobs.Job("odd", {"nope": lambda message, context: message}))
    with pytest.raises(ValueError, match=r"mode 'score' selects job 'scoring'"):
        jobs.register(jobs.Job("again", {}, run=lambda grid, cfg, run_id: ({}, Path()), modes=("score",)))
    assert jobs.registered() == before


def test_no_module_registers_handlers_on_a_client_app_itself():
    for info in pkgutil.walk_packages(fairvfl_flwr.__path__, "fairvfl_flwr."):
        module = importlib.import_module(info.name)
        text = Path(module.__file__).read_text()
        assert ".query(" not in text and ".train(" not in text, f"{info.name}: declare a Job (flower/jobs.py) instead"
