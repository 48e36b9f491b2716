"""The `ppdsl` command line: one module per subcommand, each a thin layer over the library.

Exit codes (as ruff and yamllint): 0 clean, 1 problems found in the input, 2 usage or I/O
error. No Python traceback reaches the user unless PPDSL_DEBUG=1.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from types import ModuleType

from .. import __version__
from ..diagnostics import PpsError, UsageError
from .common import print_diagnostics

# Subcommand -> module in this package, in the order `--help` lists them.
COMMANDS = ("lint", "fmt", "expand", "simulate", "show", "search", "convert", "run")


def _modules(names: Sequence[str] = COMMANDS) -> dict[str, ModuleType]:
    found = {}
    for name in names:
        try:
            found[name] = importlib.import_module(f"{__package__}.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{name}_cmd":
                raise
    return found


def build_parser(argv: Sequence[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The parser, with every subcommand; when `argv` starts with a subcommand's name, with only
    that one: the others' modules (the search, the simulator, the renderers) are then not
    imported, a tenth of a second of start-up and more on every call. What that parser says
    of the arguments is what the whole one says: they all go to the subcommand's parser."""
    parser = argparse.ArgumentParser(
        prog="ppdsl",
        description="Write, check, simulate and run pipeline-parallel training schedules.",
        epilog="Exit status: 0 clean, 1 problems in the input, 2 usage or I/O error.",
    )
    parser.add_argument("--version", action="version", version=f"ppdsl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = _modules([argv[0]] if argv and argv[0] in COMMANDS else COMMANDS)
    for name, module in modules.items():
        doc = (module.__doc__ or "").strip()
        p = sub.add_parser(name, help=doc.splitlines()[0] if doc else None, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(subparser=p)  # so an unknown option is reported with this command's usage
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    parser, modules = build_parser(sys.argv[1:] if argv is None else argv)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            getattr(args, "subparser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse: --help is 0, bad usage is 2
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(modules[args.command].run(args))
    except PpsError as exc:
        print_diagnostics(exc.diagnostics)
        return 1
    except UsageError as exc:
        print(f"ppdsl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppdsl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if os.environ.get("PPDSL_DEBUG"):
            traceback.print_exc()
        print(f"ppdsl {args.command}: internal error: {type(exc).__name__}: {exc}\n"
              "  (set PPDSL_DEBUG=1 for the traceback and please report it)", file=sys.stderr)
        return 2
