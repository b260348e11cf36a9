"""Identity keys for secure aggregation, made where they are used (``fairvfl-keys``).

On each party's machine::

    fairvfl-keys new --out /etc/fairvfl/party1.key      # private key (mode 0600); prints the public key

The party sends only the printed public key to whoever assembles the federation, who writes
the pinned peers file and hands the same file to every party::

    fairvfl-keys peers 0=<hex> 1=<hex> 2=party2.pub ... --out peers.json

and every party compares the fingerprints with its peers over another channel (a call)::

    fairvfl-keys fingerprints peers.json

The node config then names both: ``identity-key="/etc/fairvfl/party1.key"
peers="/etc/fairvfl/peers.json"`` (docs/deploy.md, section 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fairvfl_flwr.data.partydata import NodeConfigError
from fairvfl_flwr.secure import identity


def new(out: Path) -> str:
    """Write a new private key to ``out`` (refusing to overwrite one) and ``<out>.pub``; return the text to print."""
    out = out.expanduser().resolve()
    if out.exists():
        raise NodeConfigError(f"{out} exists; a new identity would orphan the one your peers pinned. "
                              "Choose another path, or delete it on purpose first")
    public = identity.new_identity(out)
    out.with_name(out.name + ".pub").write_text(public + "\n")
    return (f"private key: {out} (mode 0600: it never leaves this machine; node config {identity.IDENTITY_KEY}=\"{out}\")\n"
            f"public key:  {public}\n"
            f"fingerprint: {identity.fingerprint(public)}\n"
            f"Send the public key (or {out.name}.pub) to whoever assembles the peers file; check the fingerprint "
            "with them by another channel.")


def peers(entries: list[str], out: Path) -> str:
    """The pinned peers file from ``partition=public key`` entries (hex, or a ``.pub`` file)."""
    table: dict[str, str] = {}
    for entry in entries:
        pid, _, value = entry.partition("=")
        if not pid.strip().isdigit() or not value:
            raise NodeConfigError(f"{entry!r}: give each party as <partition id>=<public key hex or .pub file>")
        if Path(value).expanduser().is_file():
            value = Path(value).expanduser().read_text().strip()
        identity.public_key(value, f"party {pid}")
        if pid.strip() in table:
            raise NodeConfigError(f"party {pid} is given twice")
        table[str(int(pid))] = value.strip().lower()
    ids = sorted(map(int, table))
    if ids != list(range(len(ids))):
        raise NodeConfigError(f"the peers file needs every partition 0..K-1, got {ids}")
    if len(set(table.values())) != len(table):
        raise NodeConfigError("two parties have the same public key; each party makes its own with fairvfl-keys new")
    out = out.expanduser().resolve()
    out.write_text(json.dumps(table, indent=1) + "\n")
    return (f"wrote {out} ({len(table)} parties): give every party this file; each names its copy in its node "
            f"config ({identity.PEERS}=\"<its path>\") and reads these fingerprints out to the others\n" + fingerprints(out))


def fingerprints(path: Path) -> str:
    """Each party's fingerprint in a peers file, for an out-of-band check."""
    try:
        table = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as err:
        raise NodeConfigError(f"{path}: not a peers file ({err})") from None
    lines = []
    for pid in sorted(table, key=int):
        identity.public_key(table[pid], f"{path}: party {pid}")
        lines.append(f"party {pid}: {identity.fingerprint(table[pid])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fairvfl-keys", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="command", required=True, help="new, peers or fingerprints")
    a = sub.add_parser("new", help="a new private identity key on this machine; prints the public key")
    a.add_argument("--out", type=Path, required=True, help="where the private key goes (a new file, mode 0600)")
    b = sub.add_parser("peers", help="the pinned peers file from every party's public key")
    b.add_argument("keys", nargs="+", help="<partition id>=<public key hex or .pub file>, one per party")
    b.add_argument("--out", type=Path, required=True, help="the peers file to write (JSON)")
    c = sub.add_parser("fingerprints", help="a peers file's fingerprints, to compare by another channel")
    c.add_argument("peers_file", type=Path)
    args = p.parse_args(argv)
    try:
        if args.command == "new":
            print(new(args.out))
        elif args.command == "peers":
            print(peers(args.keys, args.out))
        else:
            print(fingerprints(args.peers_file))
    except NodeConfigError as exc:
        print(f"fairvfl-keys: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. /etc/fairvfl not writable by this user: say which file, no traceback
        print(f"fairvfl-keys: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
