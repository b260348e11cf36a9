"""Secure aggregation's building blocks: identity keys, the masking ring, the key agreement, the round's
view and the nonce ledger; the round hook and the party's mod that use them are features/secagg.py. And
what a party discloses over its lifetime, across runs: its ledger (ledger.py)."""
