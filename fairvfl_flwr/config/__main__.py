"""Check or rewrite what the setting declarations generate: pyproject.toml's run config, the
key tables of docs/configuration.md, the scoring job's adopted keys in docs/scoring.md and the
node-config table of docs/deploy.md.

    python -m fairvfl_flwr.config           # exit 1, naming the file, if either has drifted
    python -m fairvfl_flwr.config --write   # rewrite both from the declarations
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# the registered jobs' modes and algorithms' names and refusals are part of what the declarations generate
from fairvfl_flwr.app import jobs  # noqa: F401  (registers them; a CLI, not the config layer's API)
from fairvfl_flwr.config import node, scoring, sections, settings
from fairvfl_flwr.config.run import RunConfig

ROOT = Path(__file__).resolve().parents[2]


def generated(root: Path = ROOT) -> dict[Path, str]:
    """Each generated file's text as the declarations say it should be."""
    decl = RunConfig.settings()
    pyproject, docs, score = root / "pyproject.toml", root / "docs" / "configuration.md", root / "docs" / "scoring.md"
    deploy = root / "docs" / "deploy.md"
    return {
        pyproject: settings.replace_between(pyproject.read_text(), settings.PYPROJECT_BEGIN, settings.PYPROJECT_END,
                                            settings.render_pyproject(decl), str(pyproject)),
        docs: settings.replace_between(docs.read_text(), settings.DOCS_BEGIN, settings.DOCS_END,
                                       settings.render_docs(decl, sections.refused_with(RunConfig.key_of)), str(docs)),
        score: settings.replace_between(score.read_text(), scoring.DOCS_BEGIN, scoring.DOCS_END, scoring.render_docs(),
                                        str(score)),
        deploy: settings.replace_between(deploy.read_text(), node.DOCS_BEGIN, node.DOCS_END, node.render_docs(),
                                         str(deploy)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fairvfl_flwr.config", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the generated parts instead of checking them")
    args = ap.parse_args(argv)
    drift = [path for path, text in generated().items() if path.read_text() != text]
    for path in drift:
        if args.write:
            path.write_text(generated()[path])
            print(f"rewrote {path}")
        else:
            print(f"{path}: differs from the setting declarations; run python -m fairvfl_flwr.config --write",
                  file=sys.stderr)
    return 1 if drift and not args.write else 0


if __name__ == "__main__":
    raise SystemExit(main())
