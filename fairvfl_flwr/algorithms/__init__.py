"""The training algorithms, each a server on flower/server.py and its party handlers, registered here.

Each module declares its algorithm (config/algorithms.Algorithm); the :func:`register` call
below adds them, in ``optimizer = "auto"``'s order of preference: block Newton, AdaGrad,
gradient descent (which runs with every setting), and the split-learning baseline, which
its mode selects. A new algorithm is its module plus its entry here (docs/architecture.md,
"Adding an algorithm").
"""

from fairvfl_flwr.algorithms import fairvfl, newton, split
from fairvfl_flwr.config.algorithms import register

register(newton.NEWTON, fairvfl.ADAGRAD, fairvfl.GD, split.SPLIT)
