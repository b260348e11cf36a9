"""Whole jobs, each a sequence of messages of its own around (or instead of) the rounds:
private alignment of the parties' own tables, saving the trained model, scoring new rows.

A job sits just above the round features: it may use one, a feature never uses a job, and no
algorithm or the round loop names one. Secure aggregation's pieces are the secure layer's
(the scoring job sums under it, alignment signs with its identity keys); its own set-up
messages are a job here (key_agreement.py).
"""
