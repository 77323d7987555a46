"""The command lines README.md and docs/ show, against each module's own argparse parser, and
the HTTP paths README names, against the app's routes."""

from __future__ import annotations

import argparse
import functools
import importlib
import re
from unittest import mock

import pytest
from starlette.routing import Match, Mount

from tests.docs.docs_helpers import DOCS, rel, text


# ---- 3. command lines: the module exists and its parser takes the options shown

COMMAND = re.compile(r"python -m ((?:app|bench|train|synth)(?:\.\w+)?)\b")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.[a-z]+)?|.*\.\.\..*|<.*>")
SHELL_ENDS = {"&&", "||", "|", ";", ">", "2>&1"}


class _Parser(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _hand_over(self, args=None, namespace=None):
    raise _Parser(self)


@functools.lru_cache(maxsize=None)
def parser_of(module: str) -> argparse.ArgumentParser:
    """The parser `python -m module` builds: its main() is run until it parses (then stopped)."""
    try:
        mod = importlib.import_module("app.cli" if module == "app" else module)
    except ModuleNotFoundError as e:
        raise AssertionError(f"python -m {module}: no such module ({e})") from None
    with mock.patch.object(argparse.ArgumentParser, "parse_args", _hand_over):
        with mock.patch.object(argparse.ArgumentParser, "parse_known_args", _hand_over):
            try:
                mod.main([])
            except _Parser as got:
                return got.parser
    raise AssertionError(f"{module}: main() parsed no arguments")


def shown_commands() -> list[tuple[str, str, str]]:
    """(where, module, the command line after it) for each `python -m` of ours in the docs: to
    the end of the inline code span, or of the line in a code block."""
    found = []
    for doc in DOCS:
        source = text(doc)
        for m in COMMAND.finditer(source):
            line_start = source.rfind("\n", 0, m.start()) + 1
            before = source[line_start : m.start()]
            fenced = source.count("\n```", 0, m.start()) % 2 == 1
            in_block = "`" not in before and (fenced or before.startswith("    "))
            end = source.find("\n" if in_block else "`", m.end())
            assert 0 <= end - m.end() < 400, (
                f"{rel(doc)}: no end to {source[m.start() : m.start() + 80]!r}"
            )
            line = source[: m.start()].count("\n") + 1
            found.append(
                (f"{rel(doc)}:{line}", m.group(1), " ".join(source[m.end() : end].split()))
            )
    return found


def options_problems(module: str, args: str) -> list[str]:
    """The option names, subcommands and choices of `args` that `module`'s parser refuses."""
    code, _, comment = args.partition("#")
    tokens = code.replace("[", " ").replace("]", " ").split()
    tokens += [t for t in comment.replace("[", " ").replace("]", " ").split() if t.startswith("-")]
    parsers, problems, i, slot = [parser_of(module)], [], 0, 0
    command = f"python -m {module}"
    while i < len(tokens):
        tok = tokens[i].rstrip(",;")
        i += 1
        if tok in SHELL_ENDS:
            break
        if tok.startswith("-") and len(tok) > 1:
            name, _, inline = tok.partition("=")
            actions = [p._option_string_actions.get(name) for p in parsers]
            if None in actions:
                problems.append(f"{name}: not an option of {command}")
                continue
            action = actions[0]
            values = [inline] if inline else []
            wants = {None: 1, "?": 1, "+": 99, "*": 99}.get(action.nargs, action.nargs)
            while not inline and wants and i < len(tokens) and not tokens[i].startswith("-"):
                values.append(tokens[i].rstrip(",;"))
                i, wants = i + 1, wants - 1
            for value in values:
                if action.choices is not None and not PLACEHOLDER.fullmatch(value):
                    bad = [v for v in value.split("|") if v not in map(str, action.choices)]
                    problems += [f"{name} {v}: not one of {list(action.choices)}" for v in bad]
            continue
        positionals = [a for a in parsers[0]._actions if not a.option_strings]
        if slot >= len(positionals):
            problems.append(f"{tok}: an argument {command} does not take")
            continue
        action = positionals[slot]
        if action.choices is not None and not PLACEHOLDER.fullmatch(tok):
            names = tok.split("|")
            bad = [n for n in names if n not in action.choices]
            problems += [f"{n}: not one of {list(action.choices)}" for n in bad]
            if isinstance(action, argparse._SubParsersAction) and not bad:
                parsers, slot = [action.choices[n] for n in names], 0
                command += f" {tok}"
                continue
        if action.nargs not in ("+", "*"):
            slot += 1
    return problems


@pytest.mark.parametrize("where, module, args", shown_commands())
def test_shown_command_lines_parse(where, module, args):
    problems = options_problems(module, args)
    assert not problems, f"{where}: python -m {module} {args}: {problems}"


# ---- 4. HTTP paths: each one README names is a route of the app

PATH = re.compile(
    r"(?:\b(GET|POST|HEAD|PUT|DELETE|PATCH) )?`?"
    r"(?:(?<![\w./+~:-])|https?://(?:127\.0\.0\.1|localhost):8000)(/[A-Za-z][\w/{}.*-]*)"
)
FILESYSTEM = {"tmp", "usr", "var", "work", "proc", "opt", "etc", "dev", "sys", "home", "root"}
FILESYSTEM |= {"bin", "lib", "src", "mnt", "run", "srv", "data"}


def named_paths() -> list[tuple[str, str, str]]:
    found = set()
    for doc in DOCS:
        for m in PATH.finditer(text(doc)):
            path = m.group(2).rstrip(".,;:")
            if path.split("/")[1] in FILESYSTEM or "*" in path:
                continue
            found.add((m.group(1) or "", path, rel(doc)))
    return sorted(found)


@pytest.mark.parametrize("method, path, where", named_paths())
def test_named_paths_are_routes(live, method, path, where):
    concrete = re.sub(r"\{\w+\}", "x", path)
    scope = {"type": "http", "path": concrete, "method": method or "GET", "root_path": ""}
    scope |= {"headers": [], "query_string": b""}
    matches = {route.matches(scope)[0] for route in live.routes}
    mounts = {route.path for route in live.routes if isinstance(route, Mount)}
    wanted = {Match.FULL} if method else {Match.FULL, Match.PARTIAL}
    assert matches & wanted or path in mounts, f"{where}: {method} {path} is no route of the app"
