"""The methods fairvfl-compare runs and their table rows: names and order."""

from __future__ import annotations

from collections.abc import Sequence

from fairvfl_flwr.config.run import BY_FIELD
from fairvfl_flwr.core.constraints import MEASURES
from fairvfl_flwr.tools.paper import fairvfl_name

METHODS = ("fedbcd", "eo", "ceo", "fairvfl", "fairvfl-eo", "fairvfl-dp", "split", "central")
# the constraint-set rows (docs/fairness-constraints.md): method -> (run-config constraint, row tag)
CONSTRAINT_METHODS = {"fairvfl-eo": ("equalized-odds", "EO"), "fairvfl-dp": ("demographic-parity", "DP")}
# post-processing of the FedBCD run's scores: method -> row name
POST_NAMES = {"eo": "FedBCD + EO", "ceo": "FedBCD + CEO"}
FEDBCD_NAME = "FedBCD"
SPLIT_NAME = "Split learning (Flower example)"
CENTRAL_NAME = "Centralised ExpGrad (reference)"
#: The paper's constraint: the run config's default (a record of another is a constraint-set row)
PAPER = BY_FIELD["constraint"].default


def constraint_tag(tag: str, measure: str) -> str:
    """Row tag of a constraint-set run: ``EO`` (rate gaps, the default) or ``EO-loss``."""
    return tag if measure == "rate" else f"{tag}-{measure}"


def method_order(epsilons: Sequence[float], constraint_epsilons: Sequence[float] = ()) -> list[str]:
    """The rows in table order: the baselines, FairVFL by ε, the constraint sets, split learning, central."""
    return [FEDBCD_NAME, *POST_NAMES.values(), *[fairvfl_name(e) for e in sorted(epsilons)],
            *[fairvfl_name(e, constraint_tag(tag, m)) for _, tag in CONSTRAINT_METHODS.values()
              for m in ("rate", *[m for m in MEASURES if m != "rate"])
              for e in sorted(constraint_epsilons)],
            SPLIT_NAME, CENTRAL_NAME]


def rows_in_order(records: list[dict], epsilons: Sequence[float]) -> list[str]:
    """The methods present in ``records``, in table order (unknown names last)."""
    constraint_epsilons = sorted({r["epsilon"] for r in records if r.get("epsilon") is not None
                                  and r.get("config", {}).get("constraint", PAPER) != PAPER})
    present = list(dict.fromkeys(r["method"] for r in records))
    known = method_order(epsilons, constraint_epsilons)
    return [m for m in known if m in present] + [m for m in present if m not in known]
