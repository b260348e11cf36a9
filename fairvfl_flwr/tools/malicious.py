"""A malicious server against the real ClientApps: the in-process grid is its wire.

The real ServerApp runs; :class:`LyingGrid` rewrites what it sends before the parties get
it (:meth:`LyingGrid.tamper`) and then covers its tracks: each message's view of the round
(flower/roundview.py) lists the part that message carries, so every party's own check
passes whatever it was sent. The server also ignores its own cancellation check and keeps
every sum it decodes (:func:`decoded_sums`). What the parties do about it is theirs.

:func:`isolate` is the attack of a server that wants one passive party's Gram matrix
under secure aggregation: a probe ν to that party, ν = 0 to the others (or the real ν to
the target only), and the active party z = 1000·y, λ = 0, which makes its step zero. Were
the masks not bound to one view, the decoded sum would be the target's own logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from flwr.app import ConfigRecord, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config.run import RunConfig
from fairvfl_flwr.data import psi
from fairvfl_flwr.data.partydata import party_spec
from fairvfl_flwr.data.problem import load_data
from fairvfl_flwr.data.tables import normalise_ids, packaged_file
from fairvfl_flwr.features import secagg
from fairvfl_flwr.flower import roundview
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.flower.inprocess import InProcessGrid
from fairvfl_flwr.flower.party import party_data
from fairvfl_flwr.jobs import alignment
from fairvfl_flwr.tools import attacks
from fairvfl_flwr.tools.export import export


class LyingGrid(InProcessGrid):
    """The server's wire: :meth:`tamper` rewrites each outgoing message, :meth:`reseal`
    makes its view agree with what it carries; every reply is kept as it arrived."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.received: list[tuple[Message, dict]] = []  # (reply, {record: {key: array as it arrived}})

    def tamper(self, msg: Message) -> None:
        """What the server changes in a message before it goes out (nothing here)."""

    def push_messages(self, messages):
        messages = list(messages)
        for msg in messages:
            self.tamper(msg)
        self.reseal(messages)
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        for r in got:
            arrays = {} if r.has_error() else {name: {k: a.numpy().copy() for k, a in rec.items()}
                                               for name, rec in r.content.array_records.items()}
            self.received.append((r, arrays))
        return got

    def role(self, node_id: int) -> str:
        active = int(self.contexts[node_id].run_config.get("num-active", 1))
        return msgs.ROLE_ACTIVE if self.node_ids.index(node_id) < active else msgs.ROLE_PASSIVE

    def reseal(self, messages: list[Message]) -> None:
        """Each message's view lists the part that message carries (the first such
        message's digest for the other parts): every party's own check passes."""
        bound = [m for m in messages if roundview.VIEW in m.content.config_records]
        digests = {}
        for m in bound:
            mtype, role = m.metadata.message_type, self.role(m.metadata.dst_node_id)
            digests[id(m)] = (roundview.part_name(mtype, role), roundview.content_digest(m.content, mtype, role))
        common: dict[str, str] = {}
        for name, digest in digests.values():
            common.setdefault(name, digest)
        for m in bound:
            name, digest = digests[id(m)]
            rc = m.content.config_records.get(msgs.ROUND)
            r = int(rc["round"]) if rc is not None else int(m.content.config_records[roundview.VIEW]["round"])
            parts = {**common, name: digest}
            m.content.config_records[roundview.VIEW] = ConfigRecord(
                {"round": r, "parts": [f"{k}={v}" for k, v in sorted(parts.items())]})

    def replies(self, mtype: str | None = None) -> list[Message]:
        return [r for r, _ in self.received if mtype is None or r.metadata.message_type == mtype]

    def values(self, *names: str) -> list[np.ndarray]:
        """Every array the server received in records ``names``."""
        return [a for _, arrays in self.received for name in names for a in arrays.get(name, {}).values()]


class IsolateParty(LyingGrid):
    """ν to ``target`` only (a seeded probe, or with ``probe=False`` the real ν), ν = 0 to the
    other passive parties; the active party z = 1000·y and λ = 0. ``target=None``: the same
    probe to every passive party (a consistent broadcast, which one view allows)."""

    def __init__(self, *a, target: int | None, y: np.ndarray, probe: bool = True, seed: int = 0, **kw) -> None:
        super().__init__(*a, **kw)
        self.target_node = None if target is None else self.node_ids[target]
        self.y, self.probe, self.rng = y, probe, np.random.default_rng([seed, 0x6E75])
        self.sent: dict[int, np.ndarray] = {}  # round -> the ν the target got

    def tamper(self, msg: Message) -> None:
        mtype, rc = msg.metadata.message_type, msg.content.config_records.get(msgs.ROUND)
        payload = msg.content.array_records.get(msgs.PAYLOAD)
        if rc is None or payload is None:
            return
        t = int(rc["round"])
        if mtype == msgs.TRAIN_ACTIVE:
            z, lam = payload["z"].numpy(), payload["lam"].numpy()
            msg.content.array_records[msgs.PAYLOAD] = msgs.array_record(
                z=(1000.0 * self.y).astype(z.dtype), lam=np.zeros_like(lam))
        elif mtype == msgs.TRAIN_PASSIVE:
            nu = payload["nu"].numpy()
            if self.target_node in (None, msg.metadata.dst_node_id):
                if t not in self.sent:
                    self.sent[t] = (self.rng.standard_normal(len(nu)) / len(nu)).astype(nu.dtype) if self.probe else nu
                new = self.sent[t]
            else:
                new = np.zeros_like(nu)
            msg.content.array_records[msgs.PAYLOAD] = msgs.array_record(nu=new)


@contextlib.contextmanager
def decoded_sums() -> Iterator[dict[int, np.ndarray]]:
    """The server skips its cancellation check and keeps each round's decoded training sum."""
    sums: dict[int, np.ndarray] = {}

    def keep(total: np.ndarray, limit: float, masks: str) -> np.ndarray:
        if masks.startswith("round ") and "the train logits" in masks:
            sums[int(masks.split()[1].rstrip(":"))] = np.array(total)
        return np.abs(total) if "sq-norm" in masks else total  # ‖θ‖² must look like one to go on

    with mock.patch.object(secagg, "cancelled", keep):
        yield sums


@dataclass
class Isolation:
    """What the isolation attack got: the Gram error of the target (1.0: guessing), the
    round the parties refused in (None: they never did) and their reasons."""

    gram_error: float
    rounds_decoded: int
    refused_round: int | None
    reasons: list[str] = field(default_factory=list)
    noise: float = 0.0  # median |decoded sum| of the last round decoded (a true sum is O(1))


def isolate(run_config: dict, target: int | None, probe: bool = True, seed: int = 0,
            identities: list[dict] | None = None) -> Isolation:
    """Run the attack with the real ClientApps; score the target's Gram matrix from the sums
    decoded (``target=None``: the passive parties' summed Gram matrix Σ_k X_k X_kᵀ).
    ``identities``: each party's node-config key entries (default: the simulation's)."""
    cfg = RunConfig.from_flower(run_config)
    ds = load_data(cfg)
    k = cfg.num_parties
    ids = identities or [{} for _ in range(k)]
    grid = IsolateParty(client_app, cfg.to_flower(), k, target=target, y=ds.y_train.astype(np.float64), probe=probe,
                        seed=seed, node_configs=[{"partition-id": i, "num-partitions": k, **ids[i]} for i in range(k)])
    with decoded_sums() as sums:
        try:
            run_server(grid, cfg.to_flower())
        except FederationError:
            pass
    refused = [r for r in grid.replies() if r.has_error()]
    refused_round = min((int(r.metadata.group_id.split("-")[0]) for r in refused
                         if r.metadata.group_id.split("-")[0].isdigit()), default=None)
    blocks = [party_data(cfg, party_spec({"partition-id": j}, k, cfg.num_active)).X_train.astype(np.float64)
              for j in ([target] if target is not None else range(cfg.num_active, k))]
    X = np.concatenate(blocks, axis=1)  # X Xᵀ = Σ_k X_k X_kᵀ
    nu = {t: v.astype(np.float64) for t, v in grid.sent.items()}
    rows = attacks.score_rows(len(X), cfg.seed)
    try:
        est = attacks.gram_attack(sums, nu, cfg.eta, cfg.mu_value(len(X)), X.shape[1])
        err = attacks.gram_error(est, X, rows)
    except ValueError:  # fewer than two rounds decoded: nothing to fit
        err = 1.0
    last = max(sums) if sums else 0
    return Isolation(gram_error=min(err, 1e9), rounds_decoded=len(sums), refused_round=refused_round,
                     reasons=[r.error.reason for r in refused],
                     noise=float(np.median(np.abs(sums[last]))) if sums else 0.0)


class ResendChanged(LyingGrid):
    """Re-sends every passive party's request of round ``again`` with another ν (twice the
    real one), its view covering it; keeps the answers."""

    def __init__(self, *a, again: int = 3, **kw) -> None:
        super().__init__(*a, **kw)
        self.again, self.answers = again, []

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg in messages:
            if msg.metadata.group_id == str(self.again) and msg.metadata.message_type == msgs.TRAIN_PASSIVE:
                nu = msg.content.array_records[msgs.PAYLOAD]["nu"].numpy()
                twin = Message(RecordDict(dict(msg.content)), dst_node_id=msg.metadata.dst_node_id,
                               message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)
                twin.content.array_records[msgs.PAYLOAD] = msgs.array_record(nu=nu * 2)
                self.reseal([twin])
                self.answers.append(self._answer(twin))
        return ids


class DictionaryTest(LyingGrid):
    """Stands in for the label owner at the alignment's raise step: every other party gets ids
    of the server's choosing, blinded under the server's own key (the label owner's signature
    copied over). Were it raised, comparing with the party's blinded list would tell the
    server which of its ids the party holds."""

    def __init__(self, *a, chosen: np.ndarray, **kw) -> None:
        super().__init__(*a, **kw)
        self.blinded = psi.blind_step(normalise_ids(chosen), shuffle=False)[0]

    def tamper(self, msg: Message) -> None:
        if msg.metadata.message_type == msgs.ALIGN_RAISE:
            fields = msg.content.config_records[alignment.STEP]
            msg.content.config_records[alignment.STEP] = ConfigRecord({**fields, "blinded": self.blinded})


def _own_tables(folder: Path, rows: int = 2000) -> tuple[dict, np.ndarray]:
    """Four parties' own tables cut from Adult (90 % of the ids each, their own columns); the
    run config that aligns them, and the ids."""
    parties = (["age", "sex", "income"], ["fnlwgt"], ["capital-gain"], ["hours-per-week"])
    df = pd.read_csv(packaged_file("adult.csv.gz")).iloc[:rows][["row_id", *sum(parties, [])]].copy()
    df["customer"] = [f"C{i:06d}" for i in df["row_id"]]
    folder.mkdir(parents=True, exist_ok=True)
    for k, cols in enumerate(parties):
        df[["customer", *cols]].sample(frac=0.9, random_state=k).to_csv(folder / f"party{k}.csv", index=False)
    rc = RunConfig.from_flower({"dataset": "adult", "num-parties": 4, "num-active": 1, "optimizer": "gd",
                                "num-server-rounds": 2, "tables.own": True, "tables.reuse-alignment": False,
                                "tables.path": str(folder / "party{partition}.csv"), "tables.id-column": "customer",
                                "output-dir": str(folder / "runs")}).to_flower()
    return rc, df["customer"].to_numpy()


def _config(dataset: str, rounds: int, folder: str, **extra) -> dict:
    return RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": dataset,
                                  "num-server-rounds": rounds, "stop-tolerance": 0.0, "output-dir": folder,
                                  "privacy.secure-aggregation": True, **extra}).to_flower()


def _refused(replies: list[Message], what: str) -> str:
    refused = [r for r in replies if r.has_error()]
    return f"refused by {len({r.metadata.src_node_id for r in refused})} parties ({what})" if refused else "not refused"


def roles(dataset: str, rounds: int, folder: Path) -> list[dict]:
    """Every malicious-server role against the real ClientApps: what it got ("refused", or the figure)."""
    out = []
    rc = _config(dataset, rounds, str(folder / "runs"))
    for probe, role in ((True, "a probe ν to party 2 only, ν = 0 to the others"),
                        (False, "the real ν to party 2 only, ν = 0 to the others")):
        r = isolate(rc, 2, probe=probe)
        out.append({"role": role, "result": (f"refused in round {r.refused_round} by {len(r.reasons)} parties; "
                                             f"party 2's Gram error {r.gram_error:.3g}") if r.refused_round
                    else f"party 2's Gram error {r.gram_error:.3g}"})
    both = isolate(rc, None)
    out.append({"role": "the same probe ν to every passive party (one consistent view)",
                "result": f"the passive parties' summed Gram matrix, error {both.gram_error:.3g} after {rounds} rounds"})
    k = rc["num-parties"]
    grid = ResendChanged(client_app, rc, k)
    run_server(grid, rc)
    out.append({"role": "a re-sent round with changed ν", "result": _refused(grid.answers, "a second view of round 3")})
    manifest = export(RunConfig.from_flower({**rc, "num-server-rounds": 2}), folder / "parties", demo_keys=True)
    deployed = manifest["node_configs"]
    cases = (
        ("forged demo keys (deployed nodes without their own keys)",
         [{n: v for n, v in node.items() if n not in (secagg.IDENTITY_KEY, secagg.PEERS)} for node in deployed], {}),
        ("an unmasked run config against deployed nodes", deployed, {"privacy.secure-aggregation": False}),
    )
    for role, nodes, extra in cases:
        run = RunConfig.from_flower({"num-server-rounds": 2, **manifest["run_config"], **extra,
                                     "output-dir": str(folder / "deployed")}).to_flower()
        grid = LyingGrid(client_app, run, k, node_configs=nodes)
        try:
            run_server(grid, run)
        except FederationError:
            pass
        got = [a for a in grid.values(msgs.LOGITS, msgs.DIRECTIONS)]
        out.append({"role": role, "result": _refused(grid.replies(), "before any value left them")
                    + ("" if not got else f"; {len(got)} arrays reached the server")})
    own, ids = _own_tables(folder / "own")
    grid = DictionaryTest(client_app, own, 4, chosen=ids[:1000])
    try:
        run_server(grid, own)
    except FederationError:
        pass
    raised = [r for r in grid.replies(msgs.ALIGN_RAISE) if not r.has_error()]
    out.append({"role": "alignment: a raise request with 1,000 ids of the server's choice (Adult)",
                "result": _refused(grid.replies(msgs.ALIGN_RAISE), "alignment step 'raise'")
                + ("" if not raised else f"; {len(raised)} parties raised them")})
    return out


def main(argv: list[str] | None = None) -> None:
    """Print what the isolation attack and a consistent crafted broadcast give the server."""
    import argparse
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="crime,compas")
    p.add_argument("--rounds", default="10,30,100")
    args = p.parse_args(argv)
    print("| dataset | rounds | probe ν to party 2 only | real ν to party 2 only | the same probe ν to every passive party: Σ_k X_k X_kᵀ |")
    print("|---|---:|---|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets.split(","):
            for rounds in map(int, args.rounds.split(",")):
                rc = _config(dataset, rounds, tmp)
                cells = []
                for probe in (True, False):
                    r = isolate(rc, 2, probe=probe)
                    cells.append(f"refused in round {r.refused_round} by {len(r.reasons)} parties; Gram error "
                                 f"{r.gram_error:.3g}" if r.refused_round else f"Gram error {r.gram_error:.3g}")
                both = isolate(rc, None)
                print(f"| {dataset} | {rounds} | {cells[0]} | {cells[1]} | {both.gram_error:.3g} |")


if __name__ == "__main__":
    main()
