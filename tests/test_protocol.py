"""The protocol is the one source of message names: every type a party answers has exactly
one handler, registered from flower/protocol.py's constant, and no handler answers a type
the protocol does not know."""

import importlib
import pkgutil
from collections import Counter
from pathlib import Path

import pytest

import fairvfl_flwr
from fairvfl_flwr.app.client import HANDLER_MODULES
from fairvfl_flwr.flower import protocol as msgs


class Recorder:
    """Stands in for a ClientApp: which message type each registration names."""

    def __init__(self) -> None:
        self.types: list[str] = []

    def _category(self, category: str):
        def decorator(action: str):
            def keep(fn):
                self.types.append(f"{category}.{action}")
                return fn
            return keep
        return decorator

    def query(self, action: str):
        return self._category("query")(action)

    def train(self, action: str):
        return self._category("train")(action)


def test_every_message_type_has_exactly_one_handler():
    app = Recorder()
    for module in HANDLER_MODULES:
        module.register(app)
    counts = Counter(app.types)
    assert [t for t, n in counts.items() if n > 1] == []
    assert set(counts) == set(msgs.MESSAGE_TYPES), (set(msgs.MESSAGE_TYPES) - set(counts), set(counts) - set(msgs.MESSAGE_TYPES))


def test_the_protocol_lists_each_of_its_message_types_once():
    constants = {v for k, v in vars(msgs).items()
                 if k.isupper() and isinstance(v, str) and v.startswith(("query.", "train."))}
    assert len(msgs.MESSAGE_TYPES) == len(set(msgs.MESSAGE_TYPES))
    assert set(msgs.MESSAGE_TYPES) == constants


def test_a_handler_for_a_type_the_protocol_does_not_know_is_refused():
    app = Recorder()
    with pytest.raises(ValueError, match="'query.nope' is not a message type of the protocol"):
        msgs.register_handlers(app, {"query.nope": lambda message, context: message})
    assert app.types == []


def test_every_module_that_registers_handlers_is_in_the_client_app():
    registering = set()
    for info in pkgutil.walk_packages(fairvfl_flwr.__path__, "fairvfl_flwr."):
        if info.name.startswith(("fairvfl_flwr.app", "fairvfl_flwr.tools")):
            continue
        module = importlib.import_module(info.name)
        if "msgs.register_handlers(" in Path(module.__file__).read_text():
            registering.add(module)
    assert registering == set(HANDLER_MODULES)
