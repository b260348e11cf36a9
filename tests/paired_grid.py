"""An in-process grid that keeps every (message, reply) pair the server exchanged: what each side
received, for the tests that hold transcripts or the round protocol to it."""

from fairvfl_flwr.flower.inprocess import InProcessGrid


class PairedGrid(InProcessGrid):
    """Keeps every (message, reply) pair in :attr:`pairs`."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.pairs: list[tuple] = []

    def _answer(self, msg):
        reply = super()._answer(msg)
        self.pairs.append((msg, reply))
        return reply
