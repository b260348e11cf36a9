"""Check one party's own table on its own machine before a run: every problem at once.

    fairvfl-preflight --node-config 'partition-id=0 role="active" table-path="/data/bank.csv"
        id-column="customer" label-column="income" label-positive=">50K" sensitive-column="sex"
        group-a="Female" group-b="Male" protected-label=1 missing-values="?,NA"' \\
        --run-config "tables.missing='age=median' min-group-size=30"

The node config is the one the party's SuperNode starts with (``--node-config`` syntax);
``--run-config`` takes the run's settings the check reads (``tables.types``,
``tables.missing``, ``tables.missing-values``, ``min-group-size``, ``pool-small-groups``,
``constraint``). ``--score`` (or node config ``score-path``) also checks a file of rows to
score, against the party's saved block with ``--block <its folder>``. Prints every problem
with its column, count and example rows (data/preflight.py), and exits 1 when there is one,
2 when the arguments cannot be read. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import sys

from fairvfl_flwr.config import ConfigError, RunConfig
from fairvfl_flwr.config.node import NodeConfig, NodeConfigError
from fairvfl_flwr.data.partydata import own_table_spec, party_spec
from fairvfl_flwr.data.preflight import Report, Rules, check_party
from fairvfl_flwr.tools.cli import RunConfigArgError, parse_run_config


def run(node_config: str, run_config: str = "", table: str = "", score: str = "", block: str = "") -> Report:
    """The report of one party (see the module doc); a bad argument raises ValueError."""
    given = parse_run_config(node_config, "--node-config")
    if table:  # the file given instead of the node config's table, in a file or a database
        given = {**{k: v for k, v in given.items() if not k.startswith("table-sql")}, "table-path": table}
    node = NodeConfig.from_flower(given)
    if not (node.table_path or node.table_sql):
        raise NodeConfigError("the node config names no table-path or table-sql (or give --table)")
    cfg = RunConfig.from_flower({"tables.own": True, **parse_run_config(run_config, "--run-config")})
    spec = own_table_spec(party_spec(node, max(cfg.num_parties, node.partition_id + 1), cfg.num_active), cfg)
    return check_party(spec, Rules.of(cfg), score or node.score_path, block)


def main(argv: list[str] | None = None) -> int:
    """Console script ``fairvfl-preflight``."""
    p = argparse.ArgumentParser(prog="fairvfl-preflight", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node-config", required=True, help="the party's SuperNode --node-config text")
    p.add_argument("--run-config", default="", help="the run's settings the check reads (tables.*, min-group-size, "
                   "pool-small-groups, constraint), in flwr run --run-config syntax")
    p.add_argument("--table", default="", help="the table file to check instead of the node config's table-path")
    p.add_argument("--score", default="", help="a file of rows to score (default: the node config's score-path)")
    p.add_argument("--block", default="", help="the party's saved block folder (block.json): check the score file "
                   "against the raw columns it needs")
    args = p.parse_args(argv)
    try:
        report = run(args.node_config, args.run_config, args.table, args.score, args.block)
    except (RunConfigArgError, NodeConfigError, ConfigError) as exc:
        print(f"fairvfl-preflight: {exc}", file=sys.stderr)
        return 2
    print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
