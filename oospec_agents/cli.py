"""`oospec demo | bench | profile | project | serve | train-sidecar | train-target | adapt | average-adapters | distill`.

Each subcommand lives next to the code it drives and registers itself through `add_parser`.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

# subcommand -> module that defines add_parser(subparsers) and run(args)
COMMANDS = {
    "demo": "oospec_agents.demo",
    "bench": "oospec_agents.bench.cli",
    "profile": "oospec_agents.costmodel.profile",
    "project": "oospec_agents.costmodel.project",
    "serve": "oospec_agents.serve.cli",
    "train-sidecar": "oospec_agents.train.cli",
    "train-target": "oospec_agents.train.cli",
    "adapt": "oospec_agents.train.adapt",
    "average-adapters": "oospec_agents.train.average",
    "distill": "oospec_agents.train.distill",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="oospec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            p = sub.add_parser(name, help=f"(unavailable: {e})")
            p.set_defaults(run=lambda args, e=e: sys.exit(f"oospec: this command needs an extra: {e}"))
            continue
        mod.add_parser(sub, name)
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except ValueError as e:  # OoOSpecError and friends: a clear message, not a traceback
        print(f"oospec {args.command}: error: {e}", file=sys.stderr)
        return 2


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False, default=str))


if __name__ == "__main__":
    sys.exit(main())
