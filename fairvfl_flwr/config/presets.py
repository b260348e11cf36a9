"""Named sets of training settings (run-config key ``preset``).

* ``paper``: the paper's method, gradient steps (``optimizer = "gd"``) with the default
  η = 100, β = 0.1, c = 1e-3, Q = 5, every gap on the logistic loss (``constraint-measure
  = "loss"``) and the sensitive attribute among the model's inputs (``sensitive-as-input``);
  the reproduction tables (tools/compare, sweep, epsweep) use it.
* ``fast``: gradient steps with fewer rounds to the same target (bench/rounds.py,
  docs/performance.md): a larger primal step and a faster dual step.

Without a preset, ``optimizer = "auto"`` trains linear models with block Newton.

A preset fills in its keys only where the run config leaves them at their default, so
``preset = "fast" local-steps = 10`` keeps Q = 10. (To force a default value on top of a
preset, drop the preset.)
"""

from __future__ import annotations

from typing import Any

from fairvfl_flwr.core.errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"optimizer": "gd", "constraint_measure": "loss", "sensitive_as_input": True},
    "fast": {"optimizer": "gd", "eta": 20.0, "beta": 0.5},
}


def apply(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``values`` (snake_case field names) with the preset's settings where a value is at its default."""
    name = values.get("preset") or ""
    if name not in ("", *PRESETS):
        raise ConfigError(f"run config preset={name!r}: choose one of {', '.join(PRESETS)} (or leave it empty)")
    out = dict(values)
    for key, value in PRESETS.get(name, {}).items():
        if out.get(key, defaults[key]) == defaults[key]:
            out[key] = value
    return out
