"""Messages declare their kind (flower/protocol.py): no module outside the declaring one tells a
round's message by its name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.jobs import saving

PACKAGE = Path(__file__).resolve().parents[1] / "fairvfl_flwr"
#: Where a type's name is declared and checked: the wire contract and the job registry's format check.
DECLARING = {PACKAGE / "flower" / "protocol.py", PACKAGE / "flower" / "jobs.py"}


def _prefix_tests(path: Path) -> list[str]:
    """Every ``x.startswith("train…"/"query…")`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and node.args[0].value.startswith(("train", "query"))):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_no_module_tells_a_message_by_the_prefix_of_its_type():
    offenders = [hit for path in sorted(PACKAGE.rglob("*.py")) if path not in DECLARING for hit in _prefix_tests(path)]
    assert offenders == [], "ask flower.protocol.kind_of instead of a type's prefix: " + ", ".join(offenders)


def test_every_message_a_party_answers_has_a_kind():
    from fairvfl_flwr.app import jobs  # noqa: F401  (registers every job of the app)
    from fairvfl_flwr.flower import jobs as registry

    undeclared = [t for t in registry.message_types() if msgs.kind_of(t) is None]
    assert undeclared == []


def test_a_type_is_declared_once_with_one_kind():
    assert msgs.declare("train.kinds_test", msgs.Kind.ROUND) == "train.kinds_test"
    assert msgs.declare("train.kinds_test", msgs.Kind.ROUND) == "train.kinds_test"  # the same again: fine
    with pytest.raises(ValueError, match="declared 'round' already"):
        msgs.declare("train.kinds_test", msgs.Kind.STEP)
    assert msgs.in_rounds(msgs.NEWTON_APPLY) and not msgs.in_rounds(saving.SAVE) and not msgs.in_rounds("train.nothing")
