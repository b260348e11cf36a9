"""A refused run ends failed with one paragraph in its log, no traceback (app/refusals.py)."""

from __future__ import annotations

import io
import logging
from logging import ERROR

from flwr.supercore import log

import fairvfl_flwr.app.server  # noqa: F401  (installs the filter, as the ServerApp's process does)
from fairvfl_flwr.app.refusals import RefusalFilter
from fairvfl_flwr.flower.errors import FederationError


def _flower_log(exc: BaseException) -> str:
    """What Flower's ServerApp runner logs when main raises ``exc`` (superlink/runtime/run_serverapp.py)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        try:
            raise exc
        except Exception as ex:  # noqa: BLE001
            log(ERROR, "%s raised an exception", "ServerApp", exc_info=ex)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_refusal_is_one_paragraph_without_a_traceback():
    assert any(isinstance(f, RefusalFilter) for f in logging.getLogger("flwr").filters)
    text = _flower_log(FederationError("party 2: 3 problems in its own table; fix them"))
    assert "Traceback" not in text and "raised an exception" not in text
    assert text.count("\n") == 1 and text.startswith("FairVFL refused the run: party 2: 3 problems")
    assert "status is failed" in text


def test_a_bug_keeps_its_traceback():
    text = _flower_log(KeyError("a bug"))
    assert "Traceback" in text and "ServerApp raised an exception" in text
