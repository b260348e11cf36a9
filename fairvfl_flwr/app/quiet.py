"""Warnings raised inside other packages stay out of the run's log; ours stay in it.

A ``flwr run`` log is read by people looking for the run's own warnings (a refused
setting, a diverging round). Ray, typer and fairlearn warn about their own futures
(accelerator variables, click's API, pandas 4) in every run, which buries those. A warning
is filtered by the module it is attributed to, so a deprecated call made from this package
(a library warns with the caller's frame) is still shown.
"""

from __future__ import annotations

import warnings

#: Warnings attributed to a module outside these are dropped.
OWN_MODULES = ("fairvfl_flwr", "client_app", "server_app", "__main__")


def quiet_third_party_warnings() -> None:
    """Drop, in this process, every warning attributed to a module outside ``OWN_MODULES``."""
    own = "|".join(OWN_MODULES)
    warnings.filterwarnings("ignore", module=rf"(?!(?:{own})(?:\.|$))")
