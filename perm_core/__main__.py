"""perm-core COMMAND ... (installed), or python -m perm_core COMMAND ...  (run with --help for the list of commands)

Each command lives in perm_core/cli/NAME.py with `register(subparsers)`; the module's
`run(args) -> int` is the exit code. Exit 2 means bad usage or a model that cannot be used.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

import perm_core.cli as commands_package
from perm_core.cli import UsageError


def build_parser() -> argparse.ArgumentParser:
    # installed, the command is perm-core (pyproject.toml's [project.scripts]); from a checkout, python -m perm_core
    prog = "perm-core" if Path(sys.argv[0]).name == "perm-core" else "python -m perm_core"
    parser = argparse.ArgumentParser(prog=prog,
                                     description="Exact symmetries of Transformers: check, scramble, apply.")
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(commands_package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"perm_core.cli.{info.name}").register(sub)
    return parser


def main(argv=None) -> int:
    from perm_core.engine.spec import UnclaimedParameterError
    from perm_core.families import UnsupportedModelError
    from perm_core.run.malloc import keep_freed_memory

    args = build_parser().parse_args(argv)
    from perm_core import limits

    if limits.current().keep_freed_memory:  # TSE_KEEP_FREED_MEMORY=0: glibc's defaults, a benchmark's baseline
        keep_freed_memory()
    try:
        return args.run(args)
    except (UsageError, UnsupportedModelError, UnclaimedParameterError) as error:
        # A model the specs cannot describe is unusable, never a traceback: one line, exit 2.
        print(f"error: {str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
