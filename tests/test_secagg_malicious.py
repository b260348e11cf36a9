"""Secure aggregation against a malicious server: the grid below is the server's wire,
and each test's subclass rewrites what the real ServerApp sends."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from fairvfl_flwr.app.client import app as client_app
from fairvfl_flwr.app.run import run_inprocess
from fairvfl_flwr.app.server import run_server
from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.features import secagg
from fairvfl_flwr.secure import agreement, identity, ring, view
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.errors import FederationError
from fairvfl_flwr.tools import malicious
from fairvfl_flwr.tools.malicious import LyingGrid


class Wire(LyingGrid):
    """The malicious server's wire (tools/malicious.py), with what a test asks of it."""

    def plain_values(self):
        return [a for a in self.values(msgs.LOGITS, msgs.DIRECTIONS) if a.dtype != np.uint64]


def _config(tmp_path, **extra):
    return RunConfig.from_flower({**RunConfig().to_flower(), "optimizer": "gd", "dataset": "crime",
                                  "num-server-rounds": 6, "output-dir": str(tmp_path / "runs"),
                                  "reliability.round-timeout": 0.5, "reliability.round-retries": 1,
                                  "privacy.secure-aggregation": True, **extra}).to_flower()


def _grid(cls, tmp_path, rc, keys=True):
    k = rc["num-parties"]
    ids = identity.generate_identities(tmp_path / "identities", k)  # each party's own key file, every public key pinned
    return cls(client_app, rc, k, node_configs=[{"partition-id": i, "num-partitions": k, **(ids[i] if keys else {})}
                                                for i in range(k)])


def relayed(msg):
    """The relay of every party's signed key a message carries (round 0's messages), or None."""
    if msg.metadata.message_type == agreement.SAPEERS:
        return msg.content.config_records["secagg"]
    return msg.content.config_records.get(view.RELAY)


def relay_replies(grid):
    """The replies to the messages that carried the key relay (a gd run's round 0)."""
    return grid.replies(agreement.SAPEERS) + grid.replies(msgs.INIT)


class KeySwap(Wire):
    """Hands each party, for its next peer, an X25519 key of the server's own."""

    def tamper(self, msg):
        record = relayed(msg)
        if record is not None:
            own = self.node_ids.index(msg.metadata.dst_node_id)
            peer = (own + 1) % len(self.node_ids)
            fake = X25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                         serialization.PublicFormat.Raw)
            record[f"pk-{peer}"] = fake


def refused_at_the_relay(cls, tmp_path):
    """Run against wire ``cls``: every party refuses the message that relays the keys, and the
    server receives no logits at all, masked or not; the grid and those refusals."""
    rc = _config(tmp_path)
    grid = _grid(cls, tmp_path, rc)
    with pytest.raises(FederationError):
        run_server(grid, rc)
    peers = relay_replies(grid)
    assert len(peers) >= rc["num-parties"] and all(r.has_error() for r in peers)
    assert grid.values(msgs.LOGITS, msgs.DIRECTIONS) == []
    return grid, peers


def test_swapped_keys_every_party_refuses_naming_the_peer_and_no_value_reaches_the_server(tmp_path):
    grid, peers = refused_at_the_relay(KeySwap, tmp_path)
    for i, nid in enumerate(grid.node_ids):
        reasons = [r.error.reason for r in peers if r.metadata.src_node_id == nid]
        peer = (i + 1) % len(grid.node_ids)
        assert reasons and all(f"party {peer}'s key" in why and "refusing the run" in why for why in reasons)


def test_without_identity_files_simulation_still_signs_and_checks(tmp_path):
    rc = _config(tmp_path)
    grid = KeySwap(client_app, rc, rc["num-parties"])  # the simulation's derived keys
    with pytest.raises(FederationError):
        run_server(grid, rc)
    assert relay_replies(grid) and all(r.has_error() for r in relay_replies(grid))


def test_the_keys_come_with_discovery_and_the_set_up_adds_one_message(tmp_path):
    rc = _config(tmp_path, **{"num-server-rounds": 2})
    grid = _grid(Wire, tmp_path, rc)
    run_server(grid, rc)
    k = rc["num-parties"]
    assert grid.replies(agreement.SAKEYS) == grid.replies(agreement.SAPEERS) == []  # no message of their own
    keys = [r.content.config_records["secagg"] for r in grid.replies(msgs.INFO)]
    assert len(keys) == k and all(len(rec["signature"]) == 64 and len(rec["public"]) == 32 for rec in keys)
    assert len(grid.replies(msgs.INIT)) == k
    assert grid.plain_values() == [] and grid.values(msgs.LOGITS)  # masked words only


class SplitSession(Wire):
    """Asks party 2 for its key of another session than the other parties'."""

    def tamper(self, msg):
        if msg.metadata.message_type == msgs.INFO and msg.metadata.dst_node_id == self.node_ids[2]:
            msg.content.config_records["secagg"] = agreement.key_request(agreement.new_session())


def test_a_key_asked_for_another_session_on_discovery_is_refused_by_every_party(tmp_path):
    grid, peers = refused_at_the_relay(SplitSession, tmp_path)
    assert all("party 2's key" in r.error.reason for r in peers if r.metadata.src_node_id != grid.node_ids[2])


class Relabel(Wire):
    """From round 3 on, labels every training request "round 0", where θ = 0 made each
    party's reply its bare mask."""

    def tamper(self, msg):
        rc = msg.content.config_records.get(msgs.ROUND)
        if msg.metadata.message_type.startswith("train.") and rc is not None and int(rc["round"]) >= 3:
            msg.content.config_records[msgs.ROUND] = ConfigRecord({**rc, "round": 0})


def every_party_refuses(grid, rc, why: str) -> list:
    """Run the lying server's exchange: it fails, every party refused naming ``why``, and no
    unmasked value reached the server. The refusals."""
    with pytest.raises(FederationError):
        run_server(grid, rc)
    refused = [r for r in grid.replies() if r.has_error()]
    assert refused and all(why in r.error.reason for r in refused)
    assert len({r.metadata.src_node_id for r in refused}) == rc["num-parties"]
    assert grid.plain_values() == []
    return refused


def test_relabelled_rounds_are_refused(tmp_path):
    rc = _config(tmp_path)
    every_party_refuses(_grid(Relabel, tmp_path, rc), rc, "never moves back")


def _words(reply):
    assert not reply.has_error(), reply.error.reason
    return {"train": reply.content.array_records[msgs.LOGITS]["train"].numpy().copy(),
            "sq-norm": np.frombuffer(reply.content.config_records[secagg.SQ_NORM]["sq-norm"], dtype=np.uint64)}


class Replay(Wire):
    """Sends every party's round-3 request twice; keeps both replies."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.pairs = []

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages):
            if msg.metadata.group_id == "3":
                self.pairs.append(tuple(_words(r) for r in (self._replies[mid], self._answer(msg))))
        return ids


def test_a_replayed_request_gets_the_identical_masked_reply(tmp_path):
    rc = _config(tmp_path)
    grid = _grid(Replay, tmp_path, rc)
    run_server(grid, rc)
    assert len(grid.pairs) == rc["num-parties"]
    for first, again in grid.pairs:
        assert first["train"].dtype == np.uint64 and set(first) == {"train", "sq-norm"}
        assert all(np.array_equal(first[key], again[key]) for key in first)
    assert grid.plain_values() == []


def test_a_scoring_job_under_secure_aggregation_gives_the_server_masked_words_and_the_same_predictions(tmp_path):
    base = {"dataset": "crime", "num-server-rounds": 6, "num-parties": 4}
    _, model = run_inprocess({**base, "output-dir": str(tmp_path / "train")}, quiet=True)
    scored = {}
    for masked in (False, True):
        rc = RunConfig.from_flower({**base, "mode": "score", "score.model-from": str(model), "score.chunk-rows": 150,
                                    "output-dir": str(tmp_path / f"score-{masked}"),
                                    "privacy.secure-aggregation": masked}).to_flower()
        grid = _grid(Wire, tmp_path, rc, keys=masked)  # a node with identity keys refuses unmasked jobs
        summary, out = run_server(grid, rc)
        scored[masked] = (grid.values(msgs.LOGITS), pd.read_csv(out / "predictions.csv"), summary)
    (plain, p_plain, s_plain), (words, p_masked, s_masked) = scored[False], scored[True]
    assert s_masked["chunks"] > 1 and len(words) == len(plain) == 2 * 4 * s_masked["chunks"]  # logits and ids
    assert p_masked["id"].tolist() == p_plain["id"].tolist()
    assert (p_masked["decision"] == p_plain["decision"]).all()
    np.testing.assert_allclose(p_masked["probability"], p_plain["probability"], rtol=0, atol=1e-12)
    logits = [w for w in words if w.dtype.kind in "uif"]  # not the chunk's ids
    assert logits and all(w.dtype == np.uint64 for w in logits)  # only masked words, no float partial logit
    clear = [u for u in plain if u.dtype.kind == "f"]
    for w, u in zip(logits, clear):  # same party, same chunk: the words are nothing like its partial logits
        assert np.median(np.abs(ring.decode(w) - u)) > 100.0


def test_a_wrong_peers_file_is_named_as_such_not_as_party_0s_key(tmp_path):
    rc = _config(tmp_path)
    k = rc["num-parties"]
    ids = identity.generate_identities(tmp_path / "identities", k)
    other = identity.generate_identities(tmp_path / "another-federation", k)
    nodes = [{"partition-id": i, "num-partitions": k, **ids[i]} for i in range(k)]
    nodes[2] = {**nodes[2], "peers": other[2]["peers"]}  # party 2 was handed another federation's peers file
    grid = Wire(client_app, rc, k, node_configs=nodes)
    with pytest.raises(FederationError):
        run_server(grid, rc)
    reasons = [r.error.reason for r in relay_replies(grid) if r.has_error()]
    mine = [why for why in reasons if "partition 2" in why]
    assert mine and all("peers file is not this federation's" in why for why in mine)
    assert not any("party 0's key" in why for why in mine)


# -- one view of the round: a server that sends different parties different values -------
def _isolation_config(tmp_path, rounds):
    return _config(tmp_path, **{"num-server-rounds": rounds, "stop-tolerance": 0.0})


@pytest.mark.parametrize("probe", [True, False], ids=["probe-nu", "real-nu-to-one"])
def test_different_nu_per_party_decodes_noise_and_every_party_refuses_the_next_round(tmp_path, probe):
    rc = _isolation_config(tmp_path, 10)
    ids = identity.generate_identities(tmp_path / "identities", rc["num-parties"])
    got = malicious.isolate(rc, target=2, probe=probe, identities=ids)
    assert got.refused_round == 2 and got.rounds_decoded == 2  # round 0 (one view) and round 1 (noise)
    assert got.noise > 100.0  # a true sum of logits is O(1); uncancelled masks are uniform over ±2^15
    assert got.gram_error >= 0.9
    assert len(got.reasons) == rc["num-parties"]  # every party, each naming a peer whose view differed
    assert all("view of round 1 differs" in why and "party " in why for why in got.reasons)


# the fast loop checks 10 rounds; the attacker's longer transcripts run in the full suite
@pytest.mark.parametrize("rounds", [10, *(pytest.param(r, marks=pytest.mark.slow) for r in (30, 100))])
def test_masks_bound_to_the_view_alone_leave_the_server_noise_over_many_rounds(tmp_path, monkeypatch, rounds):
    """Parties that never compared confirmations (the check off): the masks still do not cancel."""
    monkeypatch.setattr(view, "confirm_peers", lambda *a, **kw: None)
    got = malicious.isolate(_isolation_config(tmp_path, rounds), target=2)
    assert got.refused_round is None and got.rounds_decoded == rounds + 1
    assert got.gram_error >= 0.9


def test_without_the_binding_the_isolation_attack_reads_the_target(tmp_path, monkeypatch):
    """What the tests above guard against: masks not bound to the view cancel for any ν."""
    monkeypatch.setattr(view, "confirm_peers", lambda *a, **kw: None)
    monkeypatch.setattr(view, "bound_key", lambda key, view: key)
    got = malicious.isolate(_isolation_config(tmp_path, 30), target=2)
    assert got.gram_error < 1e-3


@pytest.mark.parametrize("tag", ["not bytes", bytes(32), None], ids=["a-string", "wrong-bytes", "in-an-array"])
def test_a_confirmation_that_is_not_the_peers_hmac_is_refused_naming_the_peer(tag):
    """The confirmations ride in one config record (t-<party> -> 32 bytes); anything else in party
    1's place, or the old per-peer arrays, is party 1's view differing or missing."""
    keys, head = {1: bytes(range(32)), 2: bytes(range(1, 33))}, b"v" * 32
    good = view.confirmations(head, 1, {0: keys[1]})["t-0"], view.confirmations(head, 2, {0: keys[2]})["t-0"]
    assert view.confirmations(head, 0, keys).keys() == {"t-1", "t-2"}
    carrying = lambda record: SimpleNamespace(content=RecordDict({view.CONFIRM: record}))  # what it reads
    view.confirm_peers(carrying(ConfigRecord({"t-1": good[0], "t-2": good[1]})), head, "party 0", keys, 3)
    record = (ArrayRecord({"t-1": msgs.blob_array(good[0]), "t-2": msgs.blob_array(good[1])}) if tag is None
              else ConfigRecord({"t-1": tag, "t-2": good[1]}))
    with pytest.raises(FederationError, match="no confirmation from party 1" if tag is None else
                       "party 1's view of round 3 differs"):
        view.confirm_peers(carrying(record), head, "party 0", keys, 3)


def test_a_resent_round_with_changed_nu_is_refused(tmp_path):
    rc = _config(tmp_path)
    grid = _grid(malicious.ResendChanged, tmp_path, rc)
    run_server(grid, rc)  # the honest exchange goes on; the altered re-sends got nothing
    assert len(grid.answers) == rc["num-parties"] - 1
    assert all(r.has_error() and "train.passive of round 3 differs from the train.passive/passive message this party answered" in r.error.reason
               for r in grid.answers)


@pytest.mark.slow  # every role runs the real ClientApps: about a minute
def test_the_audits_malicious_server_is_refused_in_every_role_but_the_consistent_broadcast(tmp_path):
    rows = malicious.roles("crime", 10, tmp_path)
    got = {r["role"]: r["result"] for r in rows}
    broadcast = [role for role in got if "(one consistent view)" in role]
    assert len(broadcast) == 1 and "summed Gram matrix" in got[broadcast[0]]
    by_hand = {r["role"]: r for r in rows if "gram_error" in r}  # across sessions: refused, or nothing decoded
    assert len(got) == 12 and len(by_hand) == 5
    assert all(got[role].startswith("refused") for role in got if role not in broadcast and role not in by_hand)
    assert all(r["gram_error"] >= 0.99 for r in by_hand.values()), {r: got[r] for r in by_hand}
    assert not any("reached the server" in result or "raised them" in result for result in got.values())


# -- Gauss-Newton blocks: a round's step lengths name the point they start from (``base``) ------
def _gauss_newton_config(tmp_path):
    return _config(tmp_path, **{"optimizer": "auto", "model": "mlp", "num-server-rounds": 8, "stop-tolerance": 0.0})


class BaseToOne(Wire):
    """Round 4: party 2 alone is sent round 3's step from round 3's base, so that it replies its
    logits at a point the other parties left (the other parties' logits are at the new one): the
    difference of two rounds' sums would be party 2's own logits and images."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent: dict[int, dict] = {}  # round -> party 2's payload as the server built it

    def tamper(self, msg):
        if msg.metadata.message_type != msgs.NEWTON_PASSIVE or msg.metadata.dst_node_id != self.node_ids[2]:
            return
        payload = {k: a.numpy().copy() for k, a in msg.content.array_records[msgs.PAYLOAD].items()}
        server_round = int(msg.content.config_records[msgs.ROUND]["round"])
        self.sent[server_round] = payload
        if server_round == 4:
            old = self.sent[3]
            msg.content.array_records[msgs.PAYLOAD] = msgs.array_record(
                **{**payload, "base": old["base"], "alpha": old["alpha"]})


def test_a_step_from_another_base_sent_to_one_party_decodes_noise(tmp_path):
    rc = _gauss_newton_config(tmp_path)
    grid = _grid(BaseToOne, tmp_path, rc)
    with pytest.raises(FederationError, match="round 4: the masks of the train logits did not cancel"):
        run_server(grid, rc)
    assert not grid.plain_values()  # party 2 answered under masks bound to a view the others do not share


class StaleBase(Wire):
    """Round 5: every party, alike (one view), is told to step from round 1's directions, which
    none of them holds any more: a server walking a party back to an old point to query it there."""

    def tamper(self, msg):
        if msg.metadata.message_type in (msgs.NEWTON_ACTIVE, msgs.NEWTON_PASSIVE) and \
                int(msg.content.config_records[msgs.ROUND]["round"]) == 5:
            payload = {k: a.numpy() for k, a in msg.content.array_records[msgs.PAYLOAD].items()}
            msg.content.array_records[msgs.PAYLOAD] = msgs.array_record(
                **{**payload, "base": np.array([1], dtype=np.int64)})


def test_a_step_from_a_point_the_party_no_longer_holds_is_refused_by_every_party(tmp_path):
    rc = _gauss_newton_config(tmp_path)
    refused = every_party_refuses(_grid(StaleBase, tmp_path, rc), rc,
                                  "step lengths for the directions of round 1, but this party holds those of rounds")
    assert len(refused) == rc["num-parties"]


class ResendOtherBase(Wire):
    """Re-sends every passive party's round-3 message with round 2's base (its view covering it):
    the same round answered twice, from two points."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.answers, self.bases = [], {}

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for msg in messages:
            if msg.metadata.message_type != msgs.NEWTON_PASSIVE:
                continue
            payload = {k: a.numpy() for k, a in msg.content.array_records[msgs.PAYLOAD].items()}
            server_round = int(msg.content.config_records[msgs.ROUND]["round"])
            self.bases[server_round] = payload["base"]
            if server_round == 3:
                twin = Message(RecordDict(dict(msg.content)), dst_node_id=msg.metadata.dst_node_id,
                               message_type=msg.metadata.message_type, group_id=msg.metadata.group_id)
                twin.content.array_records[msgs.PAYLOAD] = msgs.array_record(**{**payload, "base": self.bases[2]})
                self.reseal([twin])
                self.answers.append(self._answer(twin))
        return ids


def test_a_resent_gauss_newton_round_from_another_base_is_refused(tmp_path):
    rc = _gauss_newton_config(tmp_path)
    grid = _grid(ResendOtherBase, tmp_path, rc)
    run_server(grid, rc)  # the honest exchange goes on; the altered re-sends got nothing
    assert len(grid.answers) == rc["num-parties"] - 1
    assert all(r.has_error() and "differs from the train.newton_passive/passive message this party answered"
               in r.error.reason for r in grid.answers), [r.error.reason for r in grid.answers if r.has_error()]
