"""Split-learning VFL, the way Flower's own vertical-FL example does it (a baseline).

Flower's example (``examples/vertical-fl`` in github.com/adap/flower: ``task.py``
``ClientModel``, ``strategy.py`` ``ServerModel``) trains a model split in two: every
client maps its feature block to a small embedding (``nn.Linear(m_k, 4)``), the server
concatenates the embeddings, runs a small head (``nn.Linear(·, 1)`` + sigmoid, BCE),
takes an SGD step on the head and returns to each client the gradient of the loss
with respect to its embedding; the client backpropagates it and takes an SGD step.
No fairness term. This module is that protocol as a second mode of this app, on the
same data, split, partition, run folder and metrics as FairVFL:

============== ===================== ==========================================
message type    from server            reply
============== ===================== ==========================================
query.splitinit round config           embeddings E_k (train, test) n × d
train.split     ∂L/∂E_k, round config  new E_k, ‖θ_k‖², steps taken
============== ===================== ==========================================

Settings (run config section ``split``): ``split.embedding`` (d, default 4 as in the
example) and ``split.lr`` (SGD step of clients and head, default ``1/eta`` = 0.01,
which is both FairVFL's step and the example's ``lr=0.01``). ``model = "linear"``: the
client part is ``nn.Linear(m_k, d)`` as in the example; ``"mlp"``: two hidden ReLU
layers then ``d`` outputs. Full batch, every round, as in the example.

:class:`SplitVFL` is a sibling of FairVFL on the shared server base (no multipliers, no
ν); :data:`HANDLERS` are the parties' handlers; :data:`SPLIT` declares the algorithm
(``mode = "split"`` selects it; config/algorithms.py). Torch is
imported where this baseline runs, not at module import: the ClientApp routes to these
handlers in every run, and a linear FairVFL party must not pay torch's import.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid

from fairvfl_flwr.config import RunConfig
from fairvfl_flwr.config.algorithms import Algorithm
from fairvfl_flwr.data.problem import ServerLabels
from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.party import Handles, PartyRuntime, handlers, round_of
from fairvfl_flwr.flower.server import VFLServer
from fairvfl_flwr.flower.records import array_records

SPLIT_STATE = "split.model"


def build_embedder(kind: str, in_features: int, d: int, hidden: int, dtype: str, seed: int):
    """A client's part of the split model (seeded, like ``core.models.build_model``)."""
    from torch import nn

    from fairvfl_flwr.core.models import DTYPES, seeded  # torch: only in split mode

    with seeded(seed):
        if kind == "linear":
            model: nn.Module = nn.Linear(in_features, d)
        else:
            model = nn.Sequential(
                nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, d)
            )
    return model.to(DTYPES[dtype])


# -- ClientApp side -------------------------------------------------------------------
def _embedder(rt: PartyRuntime):
    cfg, data = rt.cfg, rt.data
    model = build_embedder(cfg.model, data.X_train.shape[1], cfg.split_embedding, cfg.hidden, cfg.dtype,
                           seed=cfg.seed * 1000 + data.partition_id)
    state = array_records(rt.context.state).get(SPLIT_STATE)
    if state is not None:
        model.load_state_dict(state.to_torch_state_dict())
    return model


def _split_reply(message: Message, rt: PartyRuntime, model, steps: int) -> Message:
    import torch

    from fairvfl_flwr.core.models import squared_norm  # torch: only in split mode

    array_records(rt.context.state)[SPLIT_STATE] = ArrayRecord(model.state_dict())
    evaluate = round_of(message)[1]
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        e_train = model(torch.from_numpy(rt.data.X_train).to(dtype)).numpy()
        e_test = model(torch.from_numpy(rt.data.X_test).to(dtype)).numpy() if evaluate else None
    return Message(msgs.logits_reply(e_train, e_test, squared_norm(model), steps), reply_to=message)


def split_init(message: Message, context: Context) -> Message:
    """Build (or rebuild) this client's embedding model; reply with its embeddings."""
    array_records(context.state).pop(SPLIT_STATE, None)
    rt = PartyRuntime(context)
    return _split_reply(message, rt, _embedder(rt), steps=0)


def split_train(message: Message, context: Context) -> Message:
    """Backpropagate the server's ∂L/∂E_k, one SGD step (Flower example's client ``evaluate``)."""
    import torch

    rt = PartyRuntime(context)
    model = _embedder(rt)
    grad = msgs.read_array(message.content, msgs.PAYLOAD, "grad")
    emb = model(torch.from_numpy(rt.data.X_train).to(next(model.parameters()).dtype))
    emb.backward(torch.as_tensor(grad, dtype=emb.dtype))
    with torch.no_grad():
        for p in model.parameters():
            p -= rt.cfg.split_step * p.grad
            p.grad = None
    return _split_reply(message, rt, model, steps=1)


#: The split-learning baseline's party handlers (routed on the ClientApp as :data:`SPLIT` is registered).
#: The start message builds the embedder afresh; a re-sent round is answered with the kept reply.
HANDLERS = handlers({msgs.SPLIT_INIT: Handles(msgs.Kind.START, split_init, keeps=(SPLIT_STATE,)),
                     msgs.SPLIT_TRAIN: Handles(msgs.Kind.ROUND, split_train, keeps=(SPLIT_STATE,))})


# -- ServerApp side -------------------------------------------------------------------
class SplitVFL(VFLServer):
    """Server of split-learning VFL: holds the head, the labels, and nothing else.

    ``z`` is the head's output on the concatenated embeddings instead of a sum of
    partial logits. The objective recorded as L(θ) is the plain mean logistic loss (no μ
    term: the example uses plain SGD), DEO is measured as for FairVFL, λ stays 0.
    """

    init_type = msgs.SPLIT_INIT
    stops = False  # the baseline runs its rounds, as Flower's example does

    def __init__(self, config: RunConfig, labels: ServerLabels, on_round=None, hooks=(), scheduler=None) -> None:
        import torch
        from torch import nn

        from fairvfl_flwr.core.models import DTYPES, seeded  # torch: only in split mode

        super().__init__(config, labels, on_round=on_round, hooks=hooks, scheduler=scheduler)
        self.mu = 0.0
        self.width = config.split_embedding
        with seeded(config.seed * 1000 + 999):
            self.head = nn.Linear(config.num_parties * self.width, 1).to(DTYPES[config.dtype])
        self.optimizer = torch.optim.SGD(self.head.parameters(), lr=config.split_step)
        self.y01 = torch.as_tensor(labels.y_train, dtype=DTYPES[config.dtype])

    def _order(self) -> list[int]:
        return [n.node_id for n in self.ordered_nodes()]

    def _embeddings(self, split: str) -> np.ndarray:
        parts = self.u_train if split == "train" else self.u_test
        return np.concatenate([parts[nid].reshape(len(parts[nid]), -1) for nid in self._order()], axis=1)

    def z(self, split: str) -> np.ndarray:
        """The head's output on the parties' embeddings of ``split``: the split-learning model's scores."""
        import torch

        with torch.no_grad():
            return self.head(torch.from_numpy(self._embeddings(split)).to(self.y01.dtype)).squeeze(-1).numpy()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Head forward/backward on the embeddings, SGD step, ∂L/∂E_k to each client."""
        import torch
        from torch import nn

        emb = torch.from_numpy(self._embeddings("train")).to(self.y01.dtype).requires_grad_()
        z = self.head(emb).squeeze(-1)
        loss = nn.functional.softplus(-self.y01 * z).mean()  # = BCE of sigmoid(z), labels in {-1,+1}
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        grads = emb.grad.split(self.width, dim=1)
        evaluate = self.evaluates(server_round)
        out = []
        for nid, g in zip(self._order(), grads):
            content = RecordDict({
                msgs.PAYLOAD: msgs.array_record(grad=g.numpy().astype(self.wire_dtype)),
                msgs.ROUND: msgs.round_config(server_round, evaluate),
            })
            out.append(Message(content, dst_node_id=nid, message_type=msgs.SPLIT_TRAIN, group_id=str(server_round)))
        return out


_PLAIN = "the split-learning baseline runs plain, synchronous, full-batch rounds"

#: The split-learning baseline as an algorithm: ``mode = "split"`` selects it; its parties save
#: no blocks (nothing scores them later) and the server keeps its final scores.
SPLIT = Algorithm(
    "split", server=SplitVFL, handlers=HANDLERS, mode="split", saves_blocks=False, keeps_scores=True,
    reason=lambda cfg, passed: "split learning as in Flower's vertical-FL example (the parties' SGD steps)",
    summary=lambda cfg: {"split.embedding": cfg.split_embedding, "split.lr": cfg.split_step},
    refuses=tuple((field, on, _PLAIN) for field, on in (
        ("batch_size", lambda c: c.batch_size > 0),
        ("secure_nu", lambda c: c.secure_nu != "none"),
        ("nu_noise", lambda c: c.nu_noise > 0),
        ("max_staleness", lambda c: c.max_staleness > 0),
        ("checkpoint_every", lambda c: c.checkpoint_every > 0),
        ("resume_from", lambda c: bool(c.resume_from)),
        ("record_view", lambda c: bool(c.record_view)),
        ("transcript_dir", lambda c: bool(c.transcript_dir)),
        ("label_dp_epsilon", lambda c: c.label_dp_epsilon > 0),
        ("secure_aggregation", lambda c: c.masked),
        ("rejoin_timeout", lambda c: c.rejoin_wait > 0),
    )),
)
