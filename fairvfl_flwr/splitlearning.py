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

Settings (run config, besides the usual ones): ``split-embedding`` (d, default 4 as in
the example) and ``split-lr`` (SGD step of clients and head, default ``1/eta`` = 0.01,
which is both FairVFL's step and the example's ``lr=0.01``). ``model = "linear"``: the
client part is ``nn.Linear(m_k, d)`` as in the example; ``"mlp"``: two hidden ReLU
layers then ``d`` outputs. Full batch, every round, as in the example.

The handlers below are registered on the app's one ``ClientApp`` (``client.app``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn

from . import messages as msgs
from .client import _setup, app
from .config import ConfigError, RunConfig
from .models import DTYPES, seeded, squared_norm
from .problem import ServerLabels
from .strategy import FairVFL

SPLIT_INIT = "query.splitinit"
SPLIT_TRAIN = "train.split"
SPLIT_STATE = "split.model"
DEFAULT_EMBEDDING = 4


def split_settings(run_config: Mapping[str, Any], cfg: RunConfig) -> tuple[int, float]:
    """(embedding size d, SGD step) from the run config, validated."""
    try:
        d = int(run_config.get("split-embedding", DEFAULT_EMBEDDING) or DEFAULT_EMBEDDING)
        lr = float(run_config.get("split-lr", 0) or cfg.lr)
    except (TypeError, ValueError):
        raise ConfigError("run config split-embedding / split-lr: expected an int / a float") from None
    if d < 1:
        raise ConfigError(f"run config split-embedding={d}: must be at least 1")
    if lr <= 0:
        raise ConfigError(f"run config split-lr={lr}: must be > 0")
    if cfg.batch_size > 0:
        raise ConfigError(f"run config batch-size={cfg.batch_size}: not supported with mode='split' (its "
                          "rounds are full batch); use batch-size=0")
    return d, lr


def build_embedder(kind: str, in_features: int, d: int, hidden: int, dtype: str, seed: int) -> nn.Module:
    """A client's part of the split model (seeded, like ``models.build_model``)."""
    with seeded(seed):
        if kind == "linear":
            model: nn.Module = nn.Linear(in_features, d)
        else:
            model = nn.Sequential(
                nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, d)
            )
    return model.to(DTYPES[dtype])


# -- ClientApp side -------------------------------------------------------------------
def _embedder(context: Context) -> tuple[RunConfig, Any, nn.Module, float]:
    cfg, data = _setup(context)
    d, lr = split_settings(context.run_config, cfg)
    model = build_embedder(cfg.model, data.X_train.shape[1], d, cfg.hidden, cfg.dtype,
                           seed=cfg.seed * 1000 + data.partition_id)
    state = context.state.array_records.get(SPLIT_STATE)
    if state is not None:
        model.load_state_dict(state.to_torch_state_dict())
    return cfg, data, model, lr


def _split_reply(message: Message, data, model: nn.Module, context: Context, steps: int) -> Message:
    context.state.array_records[SPLIT_STATE] = ArrayRecord(model.state_dict())
    evaluate = bool(message.content.config_records[msgs.ROUND]["evaluate"])
    with torch.no_grad():
        e_train = model(data.X_train).numpy()
        e_test = model(data.X_test).numpy() if evaluate else None
    return Message(msgs.logits_reply(e_train, e_test, squared_norm(model), steps), reply_to=message)


@app.query("splitinit")
def split_init(message: Message, context: Context) -> Message:
    """Build (or rebuild) this client's embedding model; reply with its embeddings."""
    context.state.array_records.pop(SPLIT_STATE, None)
    _, data, model, _ = _embedder(context)
    return _split_reply(message, data, model, context, steps=0)


@app.train("split")
def split_train(message: Message, context: Context) -> Message:
    """Backpropagate the server's ∂L/∂E_k, one SGD step (Flower example's client ``evaluate``)."""
    _, data, model, lr = _embedder(context)
    grad = msgs.read_array(message.content, msgs.PAYLOAD, "grad")
    emb = model(data.X_train)
    emb.backward(torch.as_tensor(grad, dtype=emb.dtype))
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None
    return _split_reply(message, data, model, context, steps=1)


# -- ServerApp side -------------------------------------------------------------------
class SplitVFL(FairVFL):
    """Server of split-learning VFL: holds the head, the labels, and nothing else.

    Reuses FairVFL's discovery, message exchange, history and metrics; ``z`` is the
    head's output on the concatenated embeddings instead of a sum of partial logits.
    The objective recorded as L(θ) is the plain mean logistic loss (no μ term: the
    example uses plain SGD), DEO is measured as for FairVFL, λ stays 0.
    """

    def __init__(self, config: RunConfig, labels: ServerLabels, on_round=None, *,
                 embedding: int = DEFAULT_EMBEDDING, lr: float | None = None) -> None:
        super().__init__(config.replace(fairness=False), labels, on_round=on_round)
        self.mu = 0.0
        self.embedding = embedding
        self.split_lr = lr or config.lr
        with seeded(config.seed * 1000 + 999):
            self.head = nn.Linear(config.num_parties * embedding, 1).to(DTYPES[config.dtype])
        self.optimizer = torch.optim.SGD(self.head.parameters(), lr=self.split_lr)
        self.y01 = torch.as_tensor(labels.y_train, dtype=DTYPES[config.dtype])

    def _order(self) -> list[int]:
        return [n.node_id for n in sorted(self.nodes.values(), key=lambda n: n.partition_id)]

    def _embeddings(self, split: str) -> np.ndarray:
        parts = self.u_train if split == "train" else self.u_test
        return np.concatenate([parts[nid].reshape(len(parts[nid]), -1) for nid in self._order()], axis=1)

    def _z(self, split: str) -> np.ndarray:
        with torch.no_grad():
            return self.head(torch.from_numpy(self._embeddings(split)).to(self.y01.dtype)).squeeze(-1).numpy()

    def initialise(self, grid, timeout: float) -> None:
        messages = [
            Message(msgs.init_content(True), dst_node_id=nid, message_type=SPLIT_INIT, group_id="0")
            for nid in self.nodes
        ]
        self.aggregate_train(0, self.exchange(grid, messages, timeout))

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid) -> Iterable[Message]:
        """Head forward/backward on the embeddings, SGD step, ∂L/∂E_k to each client."""
        emb = torch.from_numpy(self._embeddings("train")).to(self.y01.dtype).requires_grad_()
        z = self.head(emb).squeeze(-1)
        loss = nn.functional.softplus(-self.y01 * z).mean()  # = BCE of sigmoid(z), labels in {-1,+1}
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        grads = emb.grad.split(self.embedding, dim=1)
        evaluate = self._evaluates(server_round)
        out = []
        for nid, g in zip(self._order(), grads):
            content = RecordDict({
                msgs.PAYLOAD: msgs._arrays(grad=g.numpy().astype(self.wire_dtype)),
                msgs.ROUND: msgs.round_config(server_round, evaluate),
            })
            out.append(Message(content, dst_node_id=nid, message_type=SPLIT_TRAIN, group_id=str(server_round)))
        return out
