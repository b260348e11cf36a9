"""What a party has disclosed over its lifetime: a ledger on its own disk that no run resets.

A budget kept in a run's node state is a budget per run, and the server starts runs. A lying
server that wants more than one run's worth of a registry's answers starts another run: a
fresh session, a fresh key, a fresh draw, an empty count. Worse, the per-run budget itself is
often derived from the run config (its rounds), which the server writes. So a party whose
answers spend something that adds up across runs keeps, on its own disk, what it has given
out, and spends before it answers:

* accounts (:meth:`Ledger.spend`): a count against a lifetime limit from the party's node
  config (a registry's decrypted sums); the count never goes down;
* releases (:meth:`Ledger.release`): named releases, each with a privacy cost; asking again
  for a release already made costs nothing (the party's answer is the same, so nothing new
  is learnt), a new one adds its cost, and the sum over distinct releases may not pass the
  limit (a registry's randomized responses at different ε_S compose: their ε add up).

The file is ``disclosure.json`` in the party's state folder: its node config ``state-dir``,
else ``state/`` under its ``cache-dir``. Never the run config's folders: the server writes
those, and a fresh folder would be a fresh ledger. It is read and rewritten whole under an
exclusive lock (two runs on one SuperNode spend from one budget), and written before the
answer is computed: a crash between the two loses budget, never discloses unrecorded. A
damaged or unreadable ledger is refused, not reset.

A simulated party (no data of its own, no ``state-dir``) keeps the ledger in its node
state, for the run: a simulation's user runs every party, so there is nobody to defend.
"""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from flwr.app import ConfigRecord, Context

from fairvfl_flwr.config.node import NodeConfig
from fairvfl_flwr.data.partydata import write_atomically
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.records import config_records

try:  # POSIX; elsewhere one process per SuperNode spends at a time anyway
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

#: The ledger's file name in the party's state folder.
FILE = "disclosure.json"
#: The node state record of a simulated party's ledger (its file's JSON).
STATE = "fairvfl.disclosure"
VERSION = 1


class LedgerError(FederationError):
    """A request the party's lifetime ledger refuses, or a ledger it cannot trust."""


def ledger_folder(node: NodeConfig) -> Path | None:
    """Where ``node`` keeps its ledger: its state folder on its own disk; ``None`` for a simulated
    node (no data of its own and no ``state-dir``), which keeps it in its node state."""
    if node.state_dir:
        return Path(node.state_dir).expanduser()
    if node.deployed:
        return node.folder / "state"
    return None


class Ledger:
    """One party's ledger, open for one message: read under the lock, rewritten on every spend."""

    def __init__(self, entries: dict[str, Any], where: str, who: str) -> None:
        self.entries = entries
        self.where = where
        self.who = who

    # -- the two kinds of entry ---------------------------------------------------------
    def used(self, account: str) -> int:
        """What ``account`` has spent over the party's lifetime."""
        return int(self.entries.setdefault("accounts", {}).get(account, 0))

    def spend(self, account: str, amount: int, limit: int, what: str) -> int:
        """Count ``amount`` against ``account``'s lifetime ``limit`` (0: none) or refuse; the new total."""
        used = self.used(account)
        if limit and used + amount > limit:
            raise LedgerError(f"{self.who}: asked for {amount} {what} after {used} over its lifetime ({self.where}); "
                              f"its lifetime budget is {limit}: refused (a fresh run does not reset it)")
        self.entries["accounts"][account] = used + amount
        return used + amount

    def releases(self, kind: str) -> dict[str, float]:
        """Every release of ``kind`` made so far, by name, with its cost."""
        return dict(self.entries.setdefault("releases", {}).get(kind, {}))

    def release(self, kind: str, name: str, cost: float, limit: float, what: str) -> float:
        """Record release ``name`` of ``kind`` at ``cost`` (nothing if made before) against the lifetime
        ``limit`` on the sum of the costs of distinct releases, or refuse; the new total."""
        made = self.entries.setdefault("releases", {}).setdefault(kind, {})
        if name in made:
            return math.fsum(made.values())
        total = math.fsum(made.values()) + cost
        if total > limit * (1 + 1e-12):
            spent = ", ".join(f"{k} ({v:g})" for k, v in made.items()) or "nothing"
            raise LedgerError(f"{self.who}: asked for {what}; it has released {spent} before ({self.where}), and "
                              f"releases compose: {total:g} would pass its lifetime budget {limit:g}: refused "
                              "(a fresh run does not reset it; the same release again costs nothing)")
        made[name] = cost
        return total


def _parse(text: str, where: str, who: str) -> dict[str, Any]:
    try:
        entries = json.loads(text)
    except ValueError as exc:
        raise LedgerError(f"{who}: its disclosure ledger {where} is damaged ({exc}): refused; it is never reset "
                          "by the party (restore it from a backup, or move it away knowingly)") from None
    if not isinstance(entries, dict) or entries.get("version") != VERSION:
        raise LedgerError(f"{who}: its disclosure ledger {where} is not a version-{VERSION} ledger: refused")
    return entries


@contextmanager
def opened(context: Context, node: NodeConfig, who: str) -> Iterator[Ledger]:
    """The party's ledger for one message's spending: what the body spends is written when it
    leaves without error (before the party computes its answer), and nothing if it raises."""
    folder = ledger_folder(node)
    if folder is None:
        kept = config_records(context.state).get(STATE)
        entries = _parse(str(kept["json"]), "(node state)", who) if kept is not None else {"version": VERSION}
        ledger = Ledger(entries, "its node state, this run", who)
        yield ledger
        config_records(context.state)[STATE] = ConfigRecord({"json": json.dumps(ledger.entries, sort_keys=True)})
        return
    path = folder / FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / (FILE + ".lock"), "a+b")  # noqa: SIM115  (held for the whole spend)
    except OSError as exc:
        raise LedgerError(f"{who}: its disclosure ledger's folder {folder} cannot be written ({exc}): refused") from None
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another run's process may spend at the same time
        try:
            text = path.read_text() if path.exists() else ""
        except OSError as exc:
            raise LedgerError(f"{who}: its disclosure ledger {path} cannot be read ({exc}): refused") from None
        entries = _parse(text, str(path), who) if text else {"version": VERSION}
        ledger = Ledger(entries, str(path), who)
        yield ledger
        body = json.dumps(ledger.entries, sort_keys=True, indent=1).encode()

        def write(fh) -> None:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())

        write_atomically(path, write)
