"""Print a shell completion script: subcommands, their options and values, file names.

    eval "$(ppdsl completion bash)"                                  # in ~/.bashrc
    ppdsl completion zsh > "${fpath[1]}/_ppdsl"                       # or: source <(ppdsl completion zsh)
    ppdsl completion fish > ~/.config/fish/completions/ppdsl.fish

The script is made from the command line's own parser, so it offers what this version takes.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from attrs import frozen

from ..codes import CODES

SHELLS = ("bash", "zsh", "fish")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def run(args: argparse.Namespace) -> int:
    from . import build_parser

    parser, _ = build_parser()
    print(WRITERS[args.shell](commands_of(parser)), end="")
    return 0


# --- what the parser takes ---------------------------------------------------------------------

@frozen
class Option:
    names: tuple[str, ...]  # `-o`, `--output`
    help: str
    takes_value: bool
    choices: tuple[str, ...]  # the values it takes, when argparse lists them
    files: bool  # a value that is a path or free text (no `type=`): file names are offered
    repeats: bool  # `action="append"`: may be given more than once


@frozen
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    positional_choices: tuple[str, ...]  # the words a positional takes
    takes_files: bool  # some positional is a file (or other free text): file names are offered


def _summary(text: str | None) -> str:
    """The first line of a help text, as plain words (no `%%`, no backquotes)."""
    lines = (text or "").strip().splitlines()
    return lines[0].rstrip(".").replace("%%", "%").replace("`", "") if lines else ""


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its actions only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    out = []
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        takes_value = action.nargs != 0
        choices = tuple(str(c) for c in action.choices) if action.choices else ()
        if action.metavar == "CODE":  # `lint --explain`: the diagnostic codes, not file names
            choices = tuple(CODES)
        out.append(Option(tuple(action.option_strings), _summary(action.help), takes_value, choices,
                          takes_value and not choices and action.type is None,
                          isinstance(action, argparse._AppendAction)))
    return tuple(out)


def commands_of(parser: argparse.ArgumentParser) -> tuple[Command, ...]:
    """Every subcommand of `parser` (the top level first, named ``), with its options."""
    out = [Command("", "", _options(parser), tuple(_subparsers(parser)), False)]
    for name, sub in _subparsers(parser).items():
        positionals = [a for a in sub._actions if not a.option_strings]
        choices = tuple(str(c) for a in positionals if a.choices for c in a.choices)
        files = any(not a.choices for a in positionals)
        out.append(Command(name, _summary(sub.description), _options(sub), choices, files))
    return tuple(out)


# --- bash -------------------------------------------------------------------------------------

def _words(words: tuple[str, ...] | list[str]) -> str:
    return " ".join(words)


def _bash_case(command: Command) -> list[str]:
    lines = []
    for option in command.options:
        if not option.takes_value:
            continue
        pattern = "|".join(option.names)
        if option.choices:
            reply = f'COMPREPLY=($(compgen -W "{_words(option.choices)}" -- "$cur"))'
        elif option.files:
            reply = 'COMPREPLY=($(compgen -f -- "$cur"))'
        else:
            reply = "COMPREPLY=()"  # a number: nothing to offer
        lines.append(f"                {pattern}) {reply}; return ;;")
    if lines:
        lines = ['            case "$prev" in', *lines, "            esac"]
    flags = _words([n for o in command.options for n in o.names])
    rest = ('COMPREPLY=($(compgen -f -- "$cur"))' if command.takes_files else
            f'COMPREPLY=($(compgen -W "{_words(command.positional_choices)}" -- "$cur"))'
            if command.positional_choices else "COMPREPLY=()")
    lines += ['            if [[ "$cur" == -* ]]; then',
              f'                COMPREPLY=($(compgen -W "{flags}" -- "$cur"))',
              "            else",
              f"                {rest}",
              "            fi",
              "            ;;"]
    return lines


def bash(commands: tuple[Command, ...]) -> str:
    top, subs = commands[0], commands[1:]
    lines = ["# bash completion for ppdsl; made by `ppdsl completion bash`",
             "_ppdsl() {",
             "    local cur prev cmd i",
             '    cur="${COMP_WORDS[COMP_CWORD]}"',
             '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
             '    cmd=""',
             "    for ((i = 1; i < COMP_CWORD; i++)); do",
             '        case "${COMP_WORDS[i]}" in',
             "            -*) ;;",
             '            *) cmd="${COMP_WORDS[i]}"; break ;;',
             "        esac",
             "    done",
             '    case "$cmd" in',
             '        "")',
             f'            COMPREPLY=($(compgen -W "{_words(top.positional_choices)} '
             f'{_words([n for o in top.options for n in o.names])}" -- "$cur"))',
             "            ;;"]
    for command in subs:
        lines.append(f"        {command.name})")
        lines += _bash_case(command)
    lines += ["    esac",
              "}",
              "complete -o filenames -o bashdefault -F _ppdsl ppdsl",
              ""]
    return "\n".join(lines)


# --- zsh --------------------------------------------------------------------------------------

def _zsh_text(text: str) -> str:
    """Text inside a single-quoted `_arguments` spec: no brackets or colons, quotes escaped."""
    return re.sub(r"[\[\]:\\]", " ", text).replace("'", "'\\''").strip()


def _zsh_option(option: Option) -> str:
    value = ""
    if option.takes_value:
        name = option.names[-1].lstrip("-")
        action = f"({_words(option.choices)})" if option.choices else "_files" if option.files else " "
        value = f":{name}:{action}"
    help = f"[{_zsh_text(option.help)}]" if option.help else ""
    if len(option.names) == 1:
        star = "*" if option.repeats else ""
        return f"'{star}{option.names[0]}{help}{value}'"
    exclusive = "" if option.repeats else f"({_words(option.names)})"
    star = "*" if option.repeats else ""
    return f"'{exclusive}{star}'{{{','.join(option.names)}}}'{help}{value}'"


def zsh(commands: tuple[Command, ...]) -> str:
    top, subs = commands[0], commands[1:]
    described = " ".join(f"'{c.name}:{_zsh_text(c.help)}'" for c in subs)
    lines = ["#compdef ppdsl",
             "# zsh completion for ppdsl; made by `ppdsl completion zsh`",
             "_ppdsl() {",
             "    local curcontext=$curcontext state line",
             "    typeset -A opt_args",
             "    _arguments -C \\",
             *(f"        {_zsh_option(o)} \\" for o in top.options),
             "        '1: :->command' \\",
             "        '*:: :->args'",
             "    case $state in",
             "        command)",
             f"            local -a commands; commands=({described})",
             "            _describe -t commands 'ppdsl command' commands",
             "            ;;",
             "        args)",
             "            case $line[1] in"]
    for command in subs:
        rest = ["'*:file:_files'"] if command.takes_files else \
            [f"'*:value:({_words(command.positional_choices)})'"] if command.positional_choices else []
        specs = [_zsh_option(o) for o in command.options] + rest
        lines.append(f"                {command.name}) _arguments " + " ".join(specs) + " ;;")
    lines += ["            esac",
              "            ;;",
              "    esac",
              "}",
              '# Autoloaded from $fpath (#compdef) it completes at once; sourced, it registers itself.',
              'if [[ "$funcstack[1]" == _ppdsl ]]; then',
              '    _ppdsl "$@"',
              "else",
              "    compdef _ppdsl ppdsl",
              "fi",
              ""]
    return "\n".join(lines)


# --- fish -------------------------------------------------------------------------------------

def _fish_text(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(commands: tuple[Command, ...]) -> str:
    top, subs = commands[0], commands[1:]
    lines = ["# fish completion for ppdsl; made by `ppdsl completion fish`",
             "complete -c ppdsl -f"]

    def option_line(condition: str, option: Option) -> str:
        names = " ".join(f"-s {n[1:]}" if not n.startswith("--") else f"-l {n[2:]}" for n in option.names)
        value = ""
        if option.takes_value:
            value = f" -x -a {_fish_text(_words(option.choices))}" if option.choices else " -r -F" if option.files else " -x"
        described = f" -d {_fish_text(option.help)}" if option.help else ""
        return f"complete -c ppdsl -n {_fish_text(condition)} {names}{value}{described}"

    for option in top.options:
        lines.append(option_line("__fish_use_subcommand", option))
    for command in subs:
        lines.append(f"complete -c ppdsl -n __fish_use_subcommand -a {command.name} -d {_fish_text(command.help)}")
    for command in subs:
        seen = f"__fish_seen_subcommand_from {command.name}"
        for option in command.options:
            lines.append(option_line(seen, option))
        if command.takes_files:
            lines.append(f"complete -c ppdsl -n {_fish_text(seen)} -F")
        elif command.positional_choices:
            lines.append(f"complete -c ppdsl -n {_fish_text(seen)} -x -a {_fish_text(_words(command.positional_choices))}")
    return "\n".join(lines) + "\n"


WRITERS: dict[str, Callable[[tuple[Command, ...]], str]] = {"bash": bash, "zsh": zsh, "fish": fish}
