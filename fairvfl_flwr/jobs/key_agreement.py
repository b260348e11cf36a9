"""Key agreement as a job: a secure-aggregation set-up's own two messages, query.sakeys and query.sapeers.

A training run's first set-up rides on its discovery message and round 0 instead
(features/secagg.py); a rejoin's fresh session, a resumed run's rollback and a scoring job
send these two (secure/agreement.py: what each side signs, relays and checks).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from fairvfl_flwr.flower import protocol as msgs
from fairvfl_flwr.flower.jobs import Job
from fairvfl_flwr.flower.party import Handles, PartyRuntime, handlers
from fairvfl_flwr.secure import agreement
from fairvfl_flwr.flower.records import config_records


def sakeys(message: Message, context: Context) -> Message:
    """A fresh key pair per set-up (the same one for a re-sent request), its public half
    signed with this party's identity key; the private key stays here."""
    return Message(RecordDict({"secagg": agreement.signed_key(config_records(message.content)["secagg"], context)}),
                   reply_to=message)


def sapeers(message: Message, context: Context) -> Message:
    """Check every peer's signed key against its pinned identity key, then derive a shared
    key with each; a key that fails refuses the run naming the peer."""
    agreement.take_peers(config_records(message.content).get("secagg", ConfigRecord()), context, PartyRuntime(context))
    return Message(RecordDict({"secagg": ConfigRecord({"ok": True})}), reply_to=message)


#: The key agreement (training's and the scoring job's set-up; features/secagg.mask_mod masks under its keys).
def _set_up(run) -> Handles:
    # outside any view: the set-up makes the session a view is bound to; the sessions a party
    # joined only grow, so a restarted party's restore adds to them and it still refuses those it left
    return Handles(msgs.Kind.SETUP, run, merges=(agreement.SESSIONS_STATE,), in_view=False)


JOB = Job("key agreement", handlers({agreement.SAKEYS: _set_up(sakeys), agreement.SAPEERS: _set_up(sapeers)}))
