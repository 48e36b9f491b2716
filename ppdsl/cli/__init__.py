"""The `ppdsl` command line: one module per subcommand, each a thin layer over the library.

Exit codes (as ruff and yamllint): 0 clean, 1 problems found in the input, 2 usage or I/O
error. No Python traceback reaches the user unless PPDSL_DEBUG=1.

`main` is the command as a function (tests call it); `entry` is the installed `ppdsl` and
`python -m ppdsl`: `main`, then the exit (see `entry` for how it ends).
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
COMMANDS = ("lint", "fmt", "expand", "simulate", "show", "search", "convert", "run", "completion")
# The commands whose whole work is done, their files written and closed, when `main` returns:
# no child process, thread pool or paddle to shut down (not `search`, not `run`).
DONE_ON_RETURN = frozenset({"lint", "fmt", "expand", "simulate", "show", "convert", "completion"})


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


def entry() -> None:
    """The installed `ppdsl` command: `main`, then exit with its code.

    After a command of DONE_ON_RETURN, with stdout and stderr flushed, the process ends at once
    (`os._exit`) instead of having the interpreter free the program's tables object by object
    on the way out, which users wait for and which is the largest part of what they wait for
    after the work (0.10-0.18 s of a 0.75 s `ppdsl lint` of PyTorch's 262,144-action
    Interleaved1F1B CSV; more on the lowered file). Other commands, and any run under a tracer
    or profiler (coverage, `python -m cProfile`, which write their data at exit) or with
    PPDSL_DEBUG set, exit as usual."""
    code = main()
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in DONE_ON_RETURN or sys.gettrace() or sys.getprofile() or os.environ.get("PPDSL_DEBUG"):
        raise SystemExit(code)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is None:  # started with that descriptor closed: nothing was written to it
                continue
            try:
                stream.flush()
            except BrokenPipeError:  # a reader that stopped early (`| head`): what it took is what it wanted
                pass
            except OSError as exc:  # a full disk, say: the output is not whole
                if stream is sys.stdout and sys.stderr is not None:
                    print(f"ppdsl {command}: error: writing the output: {exc.strerror or exc}", file=sys.stderr)
                code = code or 2
    except KeyboardInterrupt:
        code = 130
    os._exit(code)
