"""The man page and the bash completion, both read off the argparse tree `cli` builds: they cannot drift from the
commands and options they describe. Pure: a parser in, text out."""

from __future__ import annotations

import argparse
import re

_WORD = re.compile(r"-{0,2}[A-Za-z0-9][A-Za-z0-9_.:-]*")  # what goes into the completion script unquoted


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """name -> (its parser, its one-line help), in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]


# --- man page (roff, man(7) macros) ----------------------------------------------------------------------------

_CODE = re.compile(r"`([^`]+)`")


def _roff(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line starting as a request, and the help's
    `code` (Markdown's backticks, which man shows as they are) in bold."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = _CODE.sub(r"\\fB\1\\fR", text)
    return "\n".join("\\&" + line if line[:1] in (".", "'") else line for line in text.splitlines())


def _term(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest
        return f"\\fI{_roff(name)}\\fR" + (" ..." if action.nargs in ("+", "*") else "")
    names = ", ".join(f"\\fB{_roff(o)}\\fR" for o in action.option_strings)
    if action.nargs == 0:
        return names
    value = "{" + ",".join(action.choices) + "}" if action.choices else (action.metavar or action.dest.upper())
    return f"{names} \\fI{_roff(value)}\\fR"


def _items(actions: list[argparse.Action]) -> list[str]:
    out = []
    for action in actions:
        out += [".TP", _term(action), _roff(action.help or "")]
    return out


def man(parser: argparse.ArgumentParser, version: str, files: list[tuple[str, str]],
        examples: list[tuple[str, str]] = ()) -> str:
    """gpuwarden(1): NAME, SYNOPSIS, DESCRIPTION (the parser's), OPTIONS, COMMANDS (each with the options of its
    own), EXAMPLES (what each does, then the command line), FILES."""
    prog = parser.prog
    paragraphs = [" ".join(p.split()) for p in (parser.description or prog).split("\n\n")]
    out = [f'.TH {prog.upper()} 1 "" "{prog} {version}" "User Commands"', ".SH NAME",
           f"{prog} \\- keeps GPU inference boxes alive: kernel faults, stalled engines, alerts, metrics",
           ".SH SYNOPSIS", f".B {prog}", "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]",
           ".SH DESCRIPTION", *(line for p in paragraphs for line in (".PP", _roff(p))),
           ".SH OPTIONS", *_items(_options(parser)), ".SH COMMANDS"]
    common = {o for a in _options(parser) for o in a.option_strings}  # -h, --config: said once, above
    for name, (sub, help_) in _subcommands(parser).items():
        usage = sub.format_usage().removeprefix("usage: ").strip()
        out += [f'.SS "{name}"', _roff(help_), ".PP", ".nf", _roff(" ".join(usage.split())), ".fi"]
        out += _items([a for a in _options(sub) if not common & set(a.option_strings)])
    if examples:
        out += [".SH EXAMPLES"]
        for command, what in examples:
            out += [".PP", _roff(what), ".PP", ".RS 4", ".nf", f"\\fB{_roff(command)}\\fR", ".fi", ".RE"]
    out += [".SH FILES"]
    for path, what in files:
        out += [".TP", f"\\fI{_roff(path)}\\fR", _roff(what)]
    return "\n".join(out) + "\n"


# --- bash completion -------------------------------------------------------------------------------------------

def _words(values) -> str:
    words = [str(v) for v in values]
    bad = [w for w in words if not _WORD.fullmatch(w)]
    if bad:  # the script puts them in unquoted: a word with a space or a quote would break it
        raise ValueError(f"not a plain word for bash completion: {bad}")
    return " ".join(words)


def _candidates(parser: argparse.ArgumentParser) -> list[str]:
    """What may follow in this parser: its options, and the choices of its positional arguments."""
    words = []
    for action in _options(parser):
        words += action.option_strings or [str(c) for c in action.choices or ()]
    return words


def bash_completion(parser: argparse.ArgumentParser) -> str:
    """A script for `source`: `complete -F _gpuwarden gpuwarden`. Commands, each command's options, an option's
    choices; anything else (a file, a number) falls back to bash's own completion (-o bashdefault -o default)."""
    prog = parser.prog
    subs = _subcommands(parser)
    values = []  # case patterns "command:--option": that option's choices, or bash's own (a file, a number)
    common = {o for a in _options(parser) for o in a.option_strings}  # --config: one pattern for every command
    for name, (sub, _) in [("*", (parser, "")), *subs.items()]:
        for action in _options(sub):
            if action.option_strings and action.nargs != 0 and (name == "*" or not common & set(action.option_strings)):
                pattern = "        " + "|".join(f'{name}:"{o}"' if name == "*" else f'"{name}:{o}"'
                                                    for o in action.option_strings) + ")"
                values.append(f'{pattern} COMPREPLY=($(compgen -W "{_words(action.choices)}" -- "$cur")); return;;'
                              if action.choices else f"{pattern} return;;")
    per_command = [f'        {name}) words="{_words(_candidates(sub))}";;' for name, (sub, _) in subs.items()]
    return "\n".join([
        f"# bash completion for {prog}, generated from its argument parser (`{prog} completion bash`)",
        f"_{prog}() {{",
        "    COMPREPLY=()",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" words="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        f'            {"|".join(subs)}) cmd="${{COMP_WORDS[i]}}"; break;;',
        "        esac",
        "    done",
        '    case "$cmd:$prev" in',
        *values,
        "    esac",
        '    case "$cmd" in',
        f'        "") words="{_words([*_candidates(parser), *subs])}";;',
        *per_command,
        "    esac",
        "    local w shown=()  # options only once a dash is typed: a bare Tab lists commands and choices",
        '    for w in $words; do [[ $cur == -* || $w != -* ]] && shown+=("$w"); done',
        '    COMPREPLY=($(compgen -W "${shown[*]}" -- "$cur"))',
        "}",
        f"complete -o bashdefault -o default -F _{prog} {prog}",
        "",
    ])
