"""A refused run ends failed with one paragraph in its log, no traceback (app/refusals.py)."""

from __future__ import annotations

import dataclasses
import io
import logging
from logging import ERROR

from flwr.supercore import log

import fairvfl_flwr.app.server  # noqa: F401  (installs the filter, as the ServerApp's process does)
from fairvfl_flwr.app.refusals import RefusalFilter
from fairvfl_flwr.flower.errors import FederationError


def flower_log(exc: BaseException, *then: str) -> str:
    """What Flower's ServerApp runner logs when main raises ``exc`` (superlink/runtime/run_serverapp.py),
    and ``then`` the lines it logs after (the exit banner)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        try:
            raise exc
        except Exception as ex:  # noqa: BLE001
            log(ERROR, "%s raised an exception", "ServerApp", exc_info=ex)
        for line in then:
            log(ERROR, line)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_refusal_is_one_paragraph_without_a_traceback():
    assert any(isinstance(f, RefusalFilter) for f in logging.getLogger("flwr").filters)
    text = flower_log(FederationError("party 2: 3 problems in its own table; fix them"))
    assert "Traceback" not in text and "raised an exception" not in text
    assert text.count("\n") == 1 and text.startswith("FairVFL refused the run: party 2: 3 problems")
    assert "status is failed" in text


def test_a_bug_keeps_its_traceback():
    text = flower_log(KeyError("a bug"))
    assert "Traceback" in text and "ServerApp raised an exception" in text


def test_the_exit_banner_after_a_refusal_is_dropped_and_a_bugs_is_kept():
    from flwr.supercore.exit import ExitCode
    from flwr.supercore.exit.exit_code import EXIT_CODE_HELP

    banner = f"Exit Code: {ExitCode.SERVERAPP_EXCEPTION}\n{EXIT_CODE_HELP[ExitCode.SERVERAPP_EXCEPTION]}"

    def logged(exc):
        return flower_log(exc, banner)  # as flwr_exit logs it

    refused = logged(FederationError("party 2: its table has no id column 'client_no'"))
    assert "Exit Code" not in refused and "unhandled exception" not in refused
    assert refused.count("\n") == 1 and refused.startswith("FairVFL refused the run: party 2")
    bug = logged(KeyError("a bug"))
    assert "Traceback" in bug and "Exit Code: 201" in bug and "unhandled exception" in bug


def test_a_party_that_dropped_out_is_called_a_drop_out():
    from fairvfl_flwr.app.refusals import paragraph
    from fairvfl_flwr.flower.errors import PartyUnavailable

    text = flower_log(PartyUnavailable("party 3 (passive, node 17) left the federation or is reported unavailable "
                                        "by Flower; no reply after 3 tries", frozenset({17})))
    assert "refused" not in text and "Traceback" not in text
    assert text.startswith("FairVFL stopped the run: a party dropped out: party 3 (passive, node 17) left")
    assert "reliability.rejoin-timeout" in text
    assert paragraph(FederationError("x")).startswith("FairVFL refused the run: x.")


def _party_context(node_config: dict):
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fairvfl_flwr.config import RunConfig

    for name, default in (("run_id", 1), ("node_id", 0), ("task_id", 1)):  # as the in-process grid sets them
        try:
            getattr(TaskIdentity, name)
        except RuntimeError:
            setattr(TaskIdentity, name, default)
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                   run_config=RunConfig().to_flower())


def test_a_partys_refusal_is_one_paragraph_in_its_log_and_at_the_server(caplog):
    """The real ClientApp, a node config it refuses: its log holds one paragraph (no traceback, no
    class), its reply says why, and the server's error is the party's words."""
    from flwr.app import Message, RecordDict

    from fairvfl_flwr.app.client import app
    from fairvfl_flwr.flower import protocol as msgs
    from fairvfl_flwr.flower.errors import REFUSED, party_failed

    caplog.set_level("INFO", logger="flwr")
    context = _party_context({"partition-id": 1, "table-path": "/data/retail.csv", "role": "pasive"})
    reply = app(Message(RecordDict(), dst_node_id=5, message_type=msgs.INFO, group_id="x"), context)
    assert reply.has_error() and reply.error.reason.startswith(REFUSED)
    assert "<class" not in reply.error.reason and "NodeConfigError" not in reply.error.reason
    assert "role='pasive'" in reply.error.reason and "\n" not in reply.error.reason
    records = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(records) == 1 and records[0].exc_info is None
    assert "Traceback" not in caplog.text and "<class" not in caplog.text
    assert "this party refused the run (query.info message): party 1 (/data/retail.csv)" in records[0].getMessage()
    server = str(party_failed("party 1 (node 5)", reply.error.reason))
    assert server.startswith("party 1 (node 5) refused: party 1 (/data/retail.csv): node config role='pasive'")
    assert str(party_failed("party 1", "<class 'KeyError'>:<'x'>")) == "party 1 failed: <class 'KeyError'>:<'x'>"


def test_a_bug_at_a_party_is_still_raised_with_its_traceback():
    from fairvfl_flwr.features.guards import refusal_mod

    def crash(message, context):
        raise KeyError("a bug")

    try:
        refusal_mod(None, None, crash)
    except KeyError:
        pass
    else:
        raise AssertionError("a bug at a party was answered as a refusal")


def test_a_changed_setting_is_named_when_a_party_aligns_again(tmp_path):
    from fairvfl_flwr.config import RunConfig
    from fairvfl_flwr.data import psi
    from fairvfl_flwr.data.partydata import PartySpec

    table = tmp_path / "retail.csv"
    table.write_text("client_no,spend\n1,2\n2,3\n")
    spec = PartySpec(partition_id=1, role="passive", table_path=str(table), id_column="client_no",
                     cache_dir=str(tmp_path / "cache"))
    cfg = RunConfig(num_parties=4)
    psi.keep_alignment(spec, cfg, {"key": "k", "digest": "d", "n": 2})
    changed = RunConfig(num_parties=4, seed=cfg.seed + 1, tables_train_fraction=0.7)
    _, why = psi.kept_alignment(spec, changed)
    assert why == "the run's table settings changed since its last alignment: seed, tables.train-fraction"
    _, why = psi.kept_alignment(dataclasses.replace(spec, missing_values=("?",)), cfg)
    assert why.endswith("changed since its last alignment: missing-value markers (node config missing-values, "
                        "tables.missing-values)")
