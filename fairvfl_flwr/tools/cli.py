"""Run-config text on the command line, read and written as ``flwr run --run-config`` does.

``--set`` (fairvfl-sweep, -epsweep, -compare, -audit) and ``--run-config`` (the
deployment benches) take Flower's syntax, so a setting tried with a tool can be pasted
into ``flwr run``: ``num-server-rounds=500``, ``optimizer='newton'``,
``privacy.secure-nu="ckks"``, several pairs in one argument, or a ``.toml`` file.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import click
from flwr.common.config import parse_config_args

# a run config a tool reads may name any registered job's mode or algorithm: register them
from fairvfl_flwr.app import jobs  # noqa: F401

# the pairs Flower's parser picks out of a --run-config string (flwr.common.config)
_PAIR = r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)"
_ONLY_PAIRS = re.compile(rf"\s*(?:{_PAIR}\s*)*")
_EXAMPLE = "num-server-rounds=500 optimizer='newton'"


class RunConfigArgError(ValueError):
    """A ``--set`` / ``--run-config`` argument Flower's parser cannot read; the message quotes it."""


def parse_run_config(items: str | Sequence[str], option: str = "--set") -> dict[str, Any]:
    """The run-config pairs of ``items`` (one string or one per ``option`` given), later ones winning.

    Flower's own parser reads each; what it would silently drop (text that is not
    ``key=value``) or refuse (a bare string such as ``model=mlp``) is refused here with the
    text and, for a bare string, the quoted form to write instead.
    """
    out: dict[str, Any] = {}
    for item in [items] if isinstance(items, str) else items:
        if not item.strip():
            continue
        if not item.strip().endswith(".toml") and not _ONLY_PAIRS.fullmatch(item):
            empty = re.search(r"(\S+)=(?:\s|$)", item)
            if empty:
                raise RunConfigArgError(f"{option} {item!r}: {empty[1]} has no value; an empty string is written "
                                        f"{option} \"{empty[1]}=''\"")
            raise RunConfigArgError(f"{option} {item!r}: expected key=value pairs in Flower's --run-config "
                                    f"syntax, e.g. {option} \"{_EXAMPLE}\"")
        try:
            out.update(parse_config_args([item.strip()]))
        except OSError as exc:
            raise RunConfigArgError(f"{option} {item!r}: cannot read the TOML file ({exc.strerror})") from None
        except (click.ClickException, tomllib.TOMLDecodeError, ValueError) as exc:
            raise RunConfigArgError(f"{option} {item!r}: {_why(item, exc, option)}") from None
    return out


def _why(item: str, exc: Exception, option: str) -> str:
    """The first pair of ``item`` TOML cannot read, with the quoted value when it is a bare string."""
    for key, value in re.findall(_PAIR, item):
        try:
            tomllib.loads(f"{key} = {value}")
        except tomllib.TOMLDecodeError:
            if re.fullmatch(r"[\w.:/+-]+", value):
                return f"the text {value!r} needs quotes, as flwr run wants it: {option} \"{key}='{value}'\""
            return f"{key}={value} is not a TOML value (a number, true/false or a quoted string)"
    return exc.message if isinstance(exc, click.ClickException) else str(exc)


def config_text(config: Mapping[str, object]) -> str:
    """``--run-config`` / ``--node-config`` text of ``config``: strings quoted, numbers and booleans bare."""
    parts = []
    for key, value in config.items():
        if isinstance(value, bool):
            parts.append(f"{key}={'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            parts.append(f"{key}={value}")
        else:
            text = str(value)
            if '"' in text:  # Flower's parser reads a quoted value up to the next double quote
                raise ValueError(f"config {key}={text!r}: double quotes cannot be passed in Flower's config syntax")
            parts.append(f'{key}="{text}"')
    return " ".join(parts)


def comma_list(text: str) -> list[str]:
    """``"a, b,,c"`` → ``["a", "b", "c"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]
