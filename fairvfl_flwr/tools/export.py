"""Write one CSV per party and the server's label file; print how to start the federation.

    python -m fairvfl_flwr.tools.export --dataset adult --parties 6 --out parties/
    python -m fairvfl_flwr.tools.export --csv my.csv --label income --positive ">50K" \\
        --sensitive sex --group-a Female --group-b Male --id-column id --parties 4 --out parties/

Each party file holds the row id, the split (train/test) and that party's feature
columns (encoded and standardised exactly as the simulation sees them); the active
party's file also holds the label and sensitive columns; ``party<k>.preprocessing.json`` beside
it holds how that party's raw columns became its features (it scores raw rows with it,
docs/scoring.md). ``server_labels.csv`` holds
what the server needs (row id, split, y, group, protected) and no features.
``manifest.json`` records the node and run configs, and the printed lines start a
SuperLink, one SuperNode per party and the run. A run on these files gives the same
numbers as ``flwr run`` in simulation with the same run config (the tests check it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from fairvfl_flwr.config.run import ConfigError, RunConfig
from fairvfl_flwr.data.partition import PartitionError
from fairvfl_flwr.data.partydata import (
    ID_COLUMN,
    ROLE_ACTIVE,
    ROLE_PASSIVE,
    SPLIT_COLUMN,
    active_node_config,
    label_table,
    party_table,
)
from fairvfl_flwr.data.encoding import for_columns, sidecar_path
from fairvfl_flwr.data.problem import load_data, party_columns
from fairvfl_flwr.data.tables import DataError
from fairvfl_flwr.secure import identity
from fairvfl_flwr.tools.cli import config_text

#: Run-config keys that shape the problem and the models: a deployment run must use the
#: values the files were exported with.
EXPORT_KEYS = ("dataset", "num-parties", "num-active", "active-columns", "seed", "validation-fraction")
#: On by default in a deployment, where the server and the parties are different
#: organisations: the server then receives sums over parties, never one party's logits or
#: Newton directions (docs/privacy.md). A deployed round costs the same with it; block
#: Newton shares its step lengths and needs more rounds (docs/newton.md).
SECURE_AGGREGATION = "privacy.secure-aggregation"


def export(cfg: RunConfig, out: Path, superlink: str = "127.0.0.1:9092", first_port: int = 9100,
           secure_aggregation: bool = True, demo_keys: bool = False) -> dict:
    """Write the party files, the server label file and ``manifest.json`` under ``out``.

    The manifest's run config is the deployment's: the problem's keys, the server's label
    file and ``privacy.secure-aggregation``, set by ``secure_aggregation`` alone (on unless
    turned off; ``cfg.secure_aggregation`` is not read). Each node config names the party's
    identity key ``party<k>.key`` and ``peers.json`` beside its file, which the party makes
    on its own machine (``fairvfl-keys``); ``demo_keys`` writes them all here instead, every
    private key in one folder (one-machine trials and tests only).
    """

    out = Path(out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    ds = load_data(cfg)
    columns = party_columns(cfg, ds)
    node_configs = []
    if demo_keys:  # every private key in one folder: for a trial on one machine, never a deployment
        identities = identity.generate_identities(out / "identities", cfg.num_parties)
    else:  # where each party's own key (fairvfl-keys new) and the pinned peers file will be
        identities = [{identity.IDENTITY_KEY: str(out / f"party{k}.key"), identity.PEERS: str(out / "peers.json")}
                      for k in range(cfg.num_parties)]
    for k in range(cfg.num_parties):
        path = out / f"party{k}.csv"
        party_table(cfg, ds, k).to_csv(path, index=False)
        # the party's raw columns, categories and scaling: what it needs to score raw rows later
        sidecar_path(path).write_text(json.dumps(for_columns(ds, columns[k]).to_dict(), indent=1) + "\n")
        node = {"partition-id": k, "role": ROLE_ACTIVE if k < cfg.num_active else ROLE_PASSIVE,
                "data-path": str(path), "id-column": ID_COLUMN}
        if k < cfg.num_active:
            node.update(active_node_config(cfg, ds))
        node.update(identities[k])
        node_configs.append(node)
    labels_path = out / "server_labels.csv"
    label_table(ds).to_csv(labels_path, index=False)
    run_config = {k: v for k, v in cfg.to_flower().items() if k in EXPORT_KEYS}
    run_config["server-labels"] = str(labels_path)
    run_config[SECURE_AGGREGATION] = bool(secure_aggregation)  # TOML bool; the setting reads it as "true"/"false"
    manifest = {
        "dataset": ds.name,
        "rows": {"train": len(ds.y_train), "test": len(ds.y_test)},
        "party_columns": [len(c) for c in columns],
        "superlink": superlink,
        "node_configs": node_configs,
        "run_config": run_config,
        "first_port": first_port,
        "demo_keys": bool(demo_keys),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (the SuperLink's default listening address)."""
    return host in ("localhost", "[::1]", "::1") or host.startswith("127.")


def instructions(manifest: dict, tls: bool = False) -> str:
    """The exact commands to start the SuperLink, each SuperNode and the run."""
    link = manifest["superlink"]
    host, port = link.rsplit(":", 1)
    if tls:
        link_sec = "--ssl-ca-certfile certs/ca.crt --ssl-certfile certs/server.crt --ssl-keyfile certs/server.key --enable-supernode-auth"
        node_sec = lambda k: f"--root-certificates certs/ca.crt --auth-supernode-private-key keys/party{k}"  # noqa: E731
    else:
        link_sec = "--insecure"
        node_sec = lambda k: "--insecure"  # noqa: E731
    # The app's dependencies are installed where each process runs (the SuperLink must not
    # fetch them at run time: slow, needs the network, and may pull another torch build);
    # the SuperExec's task poll sets how long each message waits before its process starts.
    lines = [
        "# 1. On the server (the organisation that owns the labels): the SuperLink",
        # Flower's SuperLink listens on 127.0.0.1 unless told otherwise: out of reach of other machines
        f"flower-superlink {link_sec}{'' if _loopback(host) else ' --host 0.0.0.0'} --port {port} "
        "--disable-runtime-dependency-installation",
    ]
    if tls:
        lines += ["# 1b. Register each party's public key (keys/partyK.pub) with the SuperLink"]
        lines += [f"flwr supernode register keys/party{k}.pub <connection>"
                  for k in range(len(manifest["node_configs"]))]
    if not manifest.get("demo_keys"):
        nodes = manifest["node_configs"]
        lines += ["# 1c. Each party makes its identity key on its own machine (the private key never leaves it)",
                  *(f"fairvfl-keys new --out {shlex.quote(n[identity.IDENTITY_KEY])}   # party {k}"
                    for k, n in enumerate(nodes)),
                  "#     and sends the printed public key; whoever assembles the federation pins them all",
                  "fairvfl-keys peers " + " ".join(f"{k}=<party {k}'s public key>" for k in range(len(nodes)))
                  + f" --out {shlex.quote(nodes[0][identity.PEERS])}",
                  "#     gives every party that file, and each checks the fingerprints by phone or in person:",
                  f"fairvfl-keys fingerprints {shlex.quote(nodes[0][identity.PEERS])}"]
    lines += ["# 2. On each party's machine (pip install the app's dependencies there, copy its CSV there",
              "#    and fix data-path if it moves); a 50 ms task poll instead of 1 s starts each message sooner:"]
    for k, node in enumerate(manifest["node_configs"]):
        lines.append(
            f"FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.05 flower-supernode {node_sec(k)} --superlink {link} "
            f"--port {manifest['first_port'] + k} --node-config {shlex.quote(config_text(node))}"
        )
    lines += [
        "# 3. From the app folder, with a connection to the SuperLink in $FLWR_HOME/config.toml:",
        f"flwr run . <connection> --run-config {shlex.quote(config_text(manifest['run_config']))} --stream",
        *(["#    privacy.secure-aggregation=true: the server receives only sums over parties, never a party's",
            "#    logits or Newton directions (docs/privacy.md); block Newton then shares its step lengths and",
            "#    needs more rounds (docs/newton.md). A resumed run needs it false."]
          if manifest["run_config"].get(SECURE_AGGREGATION) else
          ["#    Without privacy.secure-aggregation the server receives every party's partial logits and",
           "#    can rebuild a linear passive party's Gram matrix from them (docs/privacy.md)."]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fairvfl-export", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="adult", help="adult, compas, crime (or use --csv)")
    p.add_argument("--parties", type=int, default=6, help="number of parties K (default 6)")
    p.add_argument("--active", type=int, default=1, help="number of active parties (default 1)")
    p.add_argument("--active-columns", type=int, default=0, help="feature columns of the active parties (0: dataset default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split (default 0)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--superlink", default="127.0.0.1:9092", help="SuperLink address in the printed lines")
    p.add_argument("--tls", action="store_true", help="print the lines with TLS and SuperNode authentication")
    p.add_argument("--demo-keys", action="store_true",
                   help="write every party's private identity key into <out>/identities (a trial on one machine; "
                        "in a deployment each party runs fairvfl-keys new on its own machine)")
    p.add_argument("--no-secure-aggregation", dest="secure_aggregation", action="store_false",
                   help="let the server receive every party's partial logits (faster under Newton; "
                        "needed to resume a stopped run; scoring jobs work either way)")
    own = p.add_argument_group("your own table (sets dataset=csv)")
    own.add_argument("--csv", default="", help="path of your CSV table")
    own.add_argument("--label", default="", help="label column")
    own.add_argument("--positive", default="", help="positive label value")
    own.add_argument("--sensitive", default="", help="sensitive column")
    own.add_argument("--group-a", default="", help="value of the sensitive column for group a")
    own.add_argument("--group-b", default="", help="value of the sensitive column for group b")
    own.add_argument("--protected-label", type=int, default=1, help="1: N^a/N^b are rows with the positive label; -1: negative")
    own.add_argument("--id-column", default="", help="row id column (default: row number)")
    own.add_argument("--train-fraction", type=float, default=0.8, help="share of rows used for training")
    args = p.parse_args(argv)
    values = dict(dataset=args.dataset, num_parties=args.parties, num_active=args.active,
                  active_columns=args.active_columns, seed=args.seed)
    if args.csv:
        values.update(dataset="csv", csv_path=str(Path(args.csv).expanduser().resolve()), csv_label=args.label,
                      csv_positive=args.positive, csv_sensitive=args.sensitive, csv_group_a=args.group_a,
                      csv_group_b=args.group_b, csv_protected_label=args.protected_label,
                      csv_id_column=args.id_column, csv_train_fraction=args.train_fraction)
    try:
        cfg = RunConfig(**values)
        cfg.validate()
        manifest = export(cfg, args.out, superlink=args.superlink, secure_aggregation=args.secure_aggregation,
                          demo_keys=args.demo_keys)
    except (ConfigError, DataError, PartitionError, ValueError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    print(f"Wrote {len(manifest['node_configs'])} party files, server_labels.csv and manifest.json to {out}")
    print(f"  {manifest['dataset']}: {manifest['rows']['train']} training / {manifest['rows']['test']} test rows; "
          f"columns per party {manifest['party_columns']}\n")
    print(instructions(manifest, tls=args.tls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
