"""Private row alignment: the parties' common row ids by ECDH PSI (``openmined-psi``).

Before training, every party holds its own list of row ids; FairVFL needs the rows
all of them share, in one agreed order. Plain alignment (``query.info``'s id digest,
``partydata``) assumes every party already holds exactly the same ids. When they do
not, :func:`align` finds the common ids without any party handing over its list:

* the **leader** (the active party, the label owner) is the PSI *client*; each other
  party k in turn is a PSI *server* (OpenMined's roles: the client learns the result);
* per pair, three messages (OpenMined PSI, ECDH on P-256): the server's setup (its
  ids, blinded with its secret key, in a Golomb-compressed set with false-positive
  rate ``fpr``), the client's request (its ids blinded with the client's key), the
  server's response (the request re-blinded with the server's key). The client learns
  which of *its* ids are in party k's set; party k learns only the client's set size;
  neither sees the other's ids;
* the leader intersects the pairwise results and tells every party the common ids
  (sorted, so all parties use one row order). A party thus learns the common ids,
  which are a subset of its own, and the leader's set size; the leader learns the
  pairwise intersections A ∩ B_k (more than the final intersection: that is the price
  of star-shaped two-party PSI; a multi-party PSI would avoid it).

``python -m fairvfl_flwr.tools.psi --ids 45000 --parties 6`` times it on made-up ids, all
parties in this one process. A run whose parties bring their own tables (``tables.own``)
aligns inside the federation instead, over the run's messages, by a Diffie-Hellman PSI
per pair (each party blinds its ids once, each pair raises the other's list), and the
leader tells each party its common positions instead of listing the common ids
(data/align.py, features/alignment.py; ``python bench/align.py`` times that).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

from fairvfl_flwr.data.align import psi_library


@dataclass
class PairTranscript:
    """What crossed the wire between the leader (client) and one party (server)."""

    setup: bytes  # server → client
    request: bytes  # client → server
    response: bytes  # server → client
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return len(self.setup) + len(self.request) + len(self.response)


@dataclass
class Alignment:
    common: list[str]  # the common ids, sorted
    pairs: list[PairTranscript] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.pairs)


def psi_pair(client_ids: list[str], server_ids: list[str], fpr: float = 1e-9, reveal: bool = True):
    """One two-party PSI. Returns (client-side indices of common ids or the size, transcript)."""
    psi = psi_library()
    t0 = time.perf_counter()
    client = psi.client.CreateWithNewKey(reveal)
    server = psi.server.CreateWithNewKey(reveal)
    # Each side serialises what it sends; the other side parses it: exactly the wire bytes.
    setup = server.CreateSetupMessage(fpr, len(client_ids), list(server_ids)).SerializeToString()
    request = client.CreateRequest(list(client_ids)).SerializeToString()
    parsed_request = psi.Request()
    parsed_request.ParseFromString(request)
    response = server.ProcessRequest(parsed_request).SerializeToString()
    s, r = psi.ServerSetup(), psi.Response()
    s.ParseFromString(setup)
    r.ParseFromString(response)
    result = client.GetIntersection(s, r) if reveal else client.GetIntersectionSize(s, r)
    return result, PairTranscript(setup, request, response, time.perf_counter() - t0)


def align(party_ids: list[list[str]], leader: int = 0, fpr: float = 1e-9) -> Alignment:
    """The ids every party holds, found by PSI between the leader and each other party."""
    t0 = time.perf_counter()
    mine = [str(i) for i in party_ids[leader]]
    if len(set(mine)) != len(mine):
        raise ValueError(f"party {leader} has duplicate row ids")
    keep = set(range(len(mine)))
    pairs = []
    for k, ids in enumerate(party_ids):
        if k == leader:
            continue
        idx, transcript = psi_pair(mine, [str(i) for i in ids], fpr)
        keep &= set(idx)
        pairs.append(transcript)
    return Alignment(sorted(mine[i] for i in keep), pairs, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fairvfl_flwr.tools.psi",
                                description="Time PSI row alignment on made-up ids.")
    p.add_argument("--ids", type=int, default=45000, help="ids per party")
    p.add_argument("--parties", type=int, default=6, help="number of parties")
    p.add_argument("--overlap", type=float, default=0.9, help="share of each party's ids that all parties hold")
    a = p.parse_args(argv)
    import numpy as np

    rng = np.random.default_rng(0)
    common = int(a.ids * a.overlap)
    shared = [f"row-{i}" for i in range(common)]
    parties = [shared + [f"p{k}-only-{i}" for i in range(a.ids - common)] for k in range(a.parties)]
    for ids in parties:
        rng.shuffle(ids)
    cpu0 = time.process_time()
    result = align(parties)
    cpu = time.process_time() - cpu0
    assert result.common == sorted(shared), "PSI result differs from the true intersection"
    per_pair = [round(t.seconds, 2) for t in result.pairs]
    print(f"{a.parties} parties x {a.ids} ids ({common} common): {result.seconds:.1f} s wall ({cpu:.1f} s CPU) in all, "
          f"per pair {per_pair} s, {result.bytes / 1e6:.1f} MB on the wire; intersection exact")


if __name__ == "__main__":
    main()
