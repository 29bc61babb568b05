"""completion.py: a bash completion script written from an argparse parser (`lbctl completion bash`).

The script completes verbs, each verb's options, the choices of its positionals and of options that
have choices, file names after options whose metavar is FILE or PATH, and interface names after IF.
It is derived from the parser at run time, so it cannot drift from the command line it completes.
"""

from __future__ import annotations

import argparse
import re


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse exposes subparsers only through its actions
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, str]]:
    """(what may follow at this level, {option: the words its value completes from})."""
    words: list[str] = []
    values: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings:  # a positional: offer its choices
            words += [str(c) for c in action.choices or ()]
            continue
        words += action.option_strings
        if action.nargs == 0:
            continue
        if action.choices:
            completes = "-W '" + " ".join(str(c) for c in action.choices) + "'"
        elif action.metavar == "IF":
            completes = '-W "$(ls /sys/class/net 2>/dev/null)"'
        elif str(action.metavar or action.dest).upper() in ("FILE", "CONFIG", "OBJECT", "PATH", "DIR", "OUT"):
            completes = "-f"
        else:
            completes = "-W ''"  # a value of the user's own: offer nothing
        for opt in action.option_strings:
            values[opt] = completes
    return words, values


def bash(parser: argparse.ArgumentParser) -> str:
    """The bash completion script for `parser.prog`: `source <(PROG completion bash)`."""
    prog = parser.prog
    fn = "_" + re.sub(r"\W", "_", prog)
    top_words, top_values = _words(parser)
    subs = _subcommands(parser)
    verb_cases, value_cases = [], []
    for name, sub in subs.items():
        words, values = _words(sub)
        verb_cases.append(f"    {name}) words='{' '.join(words)}' ;;")
        for opt, completes in values.items():
            value_cases.append(f"    {name}:{opt}) COMPREPLY=($(compgen {completes} -- \"$cur\")); return ;;")
    for opt, completes in top_values.items():
        value_cases.append(f"    :{opt}) COMPREPLY=($(compgen {completes} -- \"$cur\")); return ;;")
    skip = " ".join(top_values)  # top-level options that take a value: their value is not the verb
    return "\n".join([
        f"# bash completion for {prog}: source <({prog} completion bash)",
        f"{fn}() {{",
        '  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} verb="" words i',
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        '    case " ' + skip + ' " in *" ${COMP_WORDS[i]} "*) ((i++)); continue ;; esac',
        '    case ${COMP_WORDS[i]} in -*) ;; *) verb=${COMP_WORDS[i]}; break ;; esac',
        "  done",
        '  case "$verb:$prev" in',
        *value_cases,
        "  esac",
        '  case "$verb" in',
        f"    '') words='{' '.join([*subs, *top_words])}' ;;",
        *verb_cases,
        "    *) words='' ;;",
        "  esac",
        '  COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "}",
        f"complete -F {fn} {prog}",
        "",
    ])
