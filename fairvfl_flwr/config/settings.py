"""Each run-config setting declared once: key, section, type, default, allowed values, help, checks.

A setting is a field of :class:`~fairvfl_flwr.config.run.RunConfig` declared with
:func:`setting`; everything else is derived from those declarations:

* the run-config key (``batch_size`` in section ``batching`` is ``batching.batch-size``);
* validation: the allowed values and the per-value rule of each setting;
* ``[tool.flwr.app.config]`` in pyproject.toml and the key tables of
  docs/configuration.md (:func:`render_pyproject`, :func:`render_docs`; tests fail when
  either drifts from the declarations, and ``python -m fairvfl_flwr.config --write``
  rewrites both).

Combinations of settings that cannot run together are one table
(``sections.REFUSED``): a refusal belongs to two settings, so it is declared once there
and listed under both keys in the docs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fairvfl_flwr.core.errors import ConfigError

#: Sections in the order the docs and pyproject list them: title, the feature's doc page,
#: and when the section's keys are read.
SECTIONS: dict[str, tuple[str, str, str]] = {
    "": ("Everyday keys", "algorithm.md", ""),
    "privacy": ("Privacy", "privacy.md", "What each option defends against and what it costs."),
    "reliability": ("Reliability", "reliability.md", "Retries, checkpoints and resume."),
    "staleness": ("Stragglers", "async.md", "Bounded-staleness rounds and simulated stragglers."),
    "batching": ("Mini-batch rounds", "performance.md", ""),
    "csv": ("Your own table", "configuration.md#your-own-table", "Read with `dataset = \"csv\"`."),
    "split": ("Split learning", "compare.md", "Read with `mode = \"split\"`, the split-learning baseline."),
    "score": ("Scoring", "scoring.md", "Read with `mode = \"score\"`."),
    "tables": ("Each party's own table", "deploy.md", "Private alignment and local preparation of raw tables."),
    "groups": ("Who holds the groups", "privacy.md#a-registry-holds-the-groups",
               "A registry party may hold the sensitive attribute instead of the label owner."),
}

#: A help text is one line of the docs table and one comment in pyproject.toml.
HELP_MAX = 220


@dataclass(frozen=True)
class Setting:
    """One run-config key as declared on RunConfig (see :func:`setting`)."""

    field: str  # the RunConfig attribute
    section: str  # "" for the everyday (flat) keys
    type: type
    default: Any
    help: str
    choices: Sequence[Any] = ()
    rule: Callable[[Any, Any], bool] | None = None  # (value, whole config) -> allowed?
    why: str = ""  # the error when ``rule`` fails
    allowed: str = ""  # the docs' short form of ``rule`` (a :class:`Rule`'s text)
    who: str = ""  # node config: which parties give it (the docs' "who" column)

    @property
    def key(self) -> str:
        """The run-config key (dotted inside a section)."""
        name = self.field.removeprefix(f"{self.section}_").replace("_", "-")
        return f"{self.section}.{name}" if self.section else name

    def refusal(self, cfg: Any) -> str | None:
        """Why ``cfg``'s value of this setting is refused on its own, or None."""
        value = getattr(cfg, self.field)
        if self.choices and value not in self.choices:
            return self._why(cfg) or f"choose one of {', '.join(map(str, self.choices))}"
        if self.rule is not None and not self.rule(value, cfg):
            return self._why(cfg)
        return None

    def _why(self, cfg: Any) -> str:
        # a rule that depends on another setting names that setting's value ("{num_parties}")
        return self.why.format_map({k: getattr(cfg, k) for k in vars(cfg)}) if "{" in self.why else self.why


class Rule:
    """A per-value rule with the short text the docs show under "allowed"."""

    def __init__(self, test: Callable[[Any], bool], text: str) -> None:
        self.test, self.text = test, text

    def __call__(self, value: Any) -> bool:
        return self.test(value)


def at_least(low: float) -> Rule:
    """A rule for values >= ``low``, shown as ">= low" in the docs."""
    return Rule(lambda v: v >= low, f">= {low}")


def above(low: float) -> Rule:
    """A rule for values > ``low``, shown as "> low" in the docs."""
    return Rule(lambda v: v > low, f"> {low}")


def within(low: float, high: float, *, open_: bool = False) -> Rule:
    """A rule for values from ``low`` to ``high`` (``open_``: both excluded), with its docs text."""
    if open_:
        return Rule(lambda v: low < v < high, f"between {low} and {high}, exclusive")
    return Rule(lambda v: low <= v <= high, f"{low} to {high}")


def setting(default: Any, help: str, *, section: str = "", choices: Iterable[Any] = (),
            rule: Callable[..., bool] | None = None, why: str = "", who: str = "") -> Any:
    """Declare a RunConfig field as a setting (a ``dataclasses.field`` carrying its declaration).

    ``rule(value)`` or ``rule(value, cfg)`` says whether a value is allowed; ``why`` is the
    error when it is not. ``choices`` lists the allowed values (``why`` then overrides the
    generated "choose one of ...").
    """
    allowed = getattr(rule, "text", "")
    if isinstance(rule, Rule) or (rule is not None and rule.__code__.co_argcount == 1):
        one = rule
        rule = lambda value, cfg: one(value)  # noqa: E731
    if len(help) > HELP_MAX or "\n" in help:
        raise ValueError(f"help of a setting is one line of at most {HELP_MAX} characters: {help!r}")
    # a Sequence is kept as given: a live one (the registered constraint kinds) stays live
    meta = {"section": section, "help": help, "choices": choices if isinstance(choices, Sequence) else tuple(choices),
            "rule": rule, "why": why, "allowed": allowed, "who": who}
    return dataclasses.field(default=default, metadata={"setting": meta})


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def declared(cls: type) -> list[Setting]:
    """The settings of a dataclass whose fields are declared with :func:`setting`, in order."""
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get("setting")
        if meta is None and f.metadata.get("not-a-setting"):  # e.g. what the reader records about the input
            continue
        if meta is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with settings.setting()")
        typ = _TYPES.get(f.type, f.type) if isinstance(f.type, str) else f.type
        out.append(Setting(f.name, meta["section"], typ, f.default, meta["help"], meta["choices"], meta["rule"],
                           meta["why"], meta["allowed"], meta["who"]))
    return out


def coerce(key: str, raw: Any, typ: type, what: str = "run config") -> Any:
    """A run-config (or node-config, ``what``) value as the setting's type (Flower hands TOML
    values; --run-config may give strings)."""
    try:
        if typ is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "1", "on", "yes"):
                return True
            if str(raw).lower() in ("false", "0", "off", "no"):
                return False
            raise ValueError
        if typ is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError
            return int(raw)
        if typ is float:
            return float(raw)
        if isinstance(raw, bool):  # a str setting whose choices include true/false, given as TOML's bool
            return "true" if raw else "false"
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} {key}={raw!r}: expected {typ.__name__}") from None


# -- what the declarations generate ---------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def by_section(settings: list[Setting]) -> dict[str, list[Setting]]:
    """The settings grouped by section, sections in the docs' order (``SECTIONS``)."""
    out: dict[str, list[Setting]] = {name: [] for name in SECTIONS}
    for s in settings:
        out[s.section].append(s)
    return out


PYPROJECT_BEGIN = "# -- run config: generated from fairvfl_flwr/config/run.py (python -m fairvfl_flwr.config --write) --"
PYPROJECT_END = "# -- end of the generated run config --"


def render_pyproject(settings: list[Setting]) -> str:
    """The ``[tool.flwr.app.config]`` tables, one commented line per key."""
    lines = [PYPROJECT_BEGIN]
    for section, items in by_section(settings).items():
        lines += ["", "[tool.flwr.app.config" + (f".{section}]" if section else "]")]
        for s in items:
            lines.append(f"# {s.help}")
            lines.append(f"{s.key.split('.')[-1]} = {_toml(s.default)}")
    return "\n".join(lines + ["", PYPROJECT_END])


DOCS_BEGIN = "<!-- settings: generated from fairvfl_flwr/config/run.py (python -m fairvfl_flwr.config --write) -->"
DOCS_END = "<!-- end of settings -->"


def cell(value: Any) -> str:
    """A value as a docs table shows it (its TOML form, as code)."""
    return f"`{_toml(value)}`"


def render_docs(settings: list[Setting], refused_with: dict[str, list[str]]) -> str:
    """The key tables of docs/configuration.md: one table per section.

    ``refused_with``: field -> the keys it cannot run with (from the refusal table).
    """
    out = [DOCS_BEGIN]
    for section, items in by_section(settings).items():
        title, page, intro = SECTIONS[section]
        heading = f"{title}: `{section}.*`" if section else title
        out += ["", f"### {heading}", ""]
        more = f" [{page}]({page})" if section else ""
        if intro or more:
            out += [(intro + more).strip(), ""]
        out += ["| key | default | allowed | meaning |", "|---|---|---|---|"]
        for s in items:
            allowed = ", ".join(cell(c) for c in s.choices) if s.choices else (
                s.allowed or s.why.split(" (")[0] or s.type.__name__)
            meaning = s.help
            if refused_with.get(s.field):
                meaning += ("" if meaning.endswith(".") else ".") + " Not with " + ", ".join(f"`{k}`" for k in refused_with[s.field]) + "."
            out.append(f"| `{s.key}` | {cell(s.default)} | {allowed} | {meaning} |")
    return "\n".join(out + ["", DOCS_END])


def replace_between(text: str, begin: str, end: str, block: str, where: str) -> str:
    """``text`` with the part from ``begin`` to ``end`` (both lines included) replaced by ``block``."""
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < 0:
        raise ValueError(f"{where}: the generated block's markers {begin!r} / {end!r} are missing")
    if text.count(begin) != 1 or text.count(end) != 1:  # a merge left a second, stale copy
        raise ValueError(f"{where}: the generated block's markers must each appear once")
    return text[:i] + block + text[j + len(end):]
