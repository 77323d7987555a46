"""The settings the documents name against app/service/config.py: every LIDARSEG_* variable
README.md, docs/, deploy/ and the Dockerfile name is a setting or a variable read outside the
settings, every setting is documented, and the defaults, ranges and values the documents state are
the fields' own."""

from __future__ import annotations

import functools
import re

import pytest

from app.service.config import OTHER_VARIABLES, PREFIX, Settings
from tests.conftest import REPO_ROOT
from tests.docs.docs_helpers import DEPLOY, DOCS, README, rel, text


FIELDS = {f"{PREFIX}{name.upper()}": name for name in Settings.model_fields}
VARIABLE = re.compile(r"LIDARSEG_[A-Z0-9_]*[A-Z0-9]")


# ---- 1. settings: every LIDARSEG_* variable a document names, and the defaults README states


def named_variables() -> list[tuple[str, str]]:
    files = [*DOCS, REPO_ROOT / "Dockerfile", *DEPLOY]
    return sorted({(name, rel(p)) for p in files for name in VARIABLE.findall(text(p))})


@pytest.mark.parametrize("name, where", named_variables())
def test_every_variable_a_document_names_is_read(name, where):
    """A setting (config.py's Settings) or one of the variables read outside it (OTHER_VARIABLES);
    anything else is set or documented for nothing (the server only warns about it)."""
    assert name in FIELDS or name in OTHER_VARIABLES, f"{where} names {name}: nothing reads it"


@functools.lru_cache(maxsize=None)
def readers() -> tuple[str, ...]:
    """The code, scripts and manifests (config.py, which lists the names, aside)."""
    roots = ("app", "kernels", "models", "bench", "train", "synth", "deploy", ".ci")
    return tuple(
        p.read_text("utf-8", "ignore")
        for root in roots
        for p in sorted((REPO_ROOT / root).rglob("*"))
        if p.is_file() and p.suffix in {".py", ".sh", ".yaml", ".yml", ""} and p.name != "config.py"
    )


@pytest.mark.parametrize("name", sorted(OTHER_VARIABLES))
def test_every_variable_read_outside_the_settings_is_read_and_documented(name):
    """OTHER_VARIABLES lists what the code, its scripts and manifests read (os.environ, a shell's
    or compose's ${...}): a name nothing reads any more must leave the list; README names each."""
    read = re.compile(rf"(environ(\.get)?\(|environ\[|getenv\()\s*[\"']{name}[\"']|\$\{{?{name}\b")
    assert any(read.search(source) for source in readers()), f"nothing reads {name}"
    assert name in text(README), f"README.md does not name {name}"


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_every_setting_is_documented(name):
    assert re.search(rf"\b{name}(?![A-Z0-9_])", text(README)), f"README.md lacks {name}"


# `LIDARSEG_X` [default, ...] or `LIDARSEG_X` (default; ...): README's form for a setting's default
STATED = re.compile(r"`(LIDARSEG_[A-Z0-9_]+)`\s*([\[(])")
UNITS = {"KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def bracket(source: str, start: int, opening: str) -> str:
    """The text inside the bracket opening at `start`, up to its partner (nesting counted)."""
    closing, depth = {"[": "]", "(": ")"}[opening], 0
    for i in range(start, len(source)):
        depth += {opening: 1, closing: -1}.get(source[i], 0)
        if depth == 0:
            return " ".join(source[start + 1 : i].split())
    raise AssertionError(f"unclosed {opening} at {start}")


def stated_defaults() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for m in STATED.finditer(text(doc)):
            if m.group(1) in FIELDS:
                found.append((m.group(1), bracket(text(doc), m.end() - 1, m.group(2)), rel(doc)))
    return found


def stated_value(said: str):
    """The value a default statement starts with: a number (2,000,000; 64 MiB), a word."""
    m = re.match(r"(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w.])(?:\s*(KiB|MiB|GiB)\b)?", said)
    if m:
        return float(m.group(1).replace(",", "")) * UNITS.get(m.group(2) or "", 1)
    m = re.match(r"[^\s,;:]+", said)
    assert m, said
    return m.group(0)


def bounds(name: str) -> tuple[float | None, float | None]:
    low = high = None
    for rule in Settings.model_fields[name].metadata:
        low = getattr(rule, "ge", getattr(rule, "gt", low))
        high = getattr(rule, "le", getattr(rule, "lt", high))
    return low, high


@pytest.mark.parametrize("name, said, where", stated_defaults())
def test_stated_defaults_and_ranges_are_the_settings(name, said, where):
    """`LIDARSEG_SHUTDOWN_BUDGET_S` [25, ...; 6 to 300]: the first value is the field's default
    (a word: a choice or true/false; 'none': no value), 'A to B' its bounds."""
    field = FIELDS[name]
    default = Settings.model_fields[field].default
    value = stated_value(said)
    if isinstance(value, float):
        assert not isinstance(default, (bool, str)), (name, said, default)
        assert value == default, f"{where}: {name} [{said}], the default is {default}"
    elif isinstance(default, bool):
        assert value == str(default).lower(), f"{where}: {name} ({said}), the default is {default}"
    elif value == "none":
        assert default in ((), "", None), f"{where}: {name} ({said}), the default is {default!r}"
    else:
        assert value == default, f"{where}: {name} ({said}), the default is {default!r}"
    for clause in re.split(r"[;,] ", said):  # a clause of its own: "6 to 300"
        m = re.fullmatch(r"(\d[\d,.]*) to (\d[\d,.]*)", clause.strip())
        if not m:
            continue
        stated = (float(m[1].replace(",", "")), float(m[2].replace(",", "")))
        assert stated == bounds(field), f"{where}: {name} [{said}], the bounds are {bounds(field)}"


def assigned_values() -> list[tuple[str, str, str]]:
    """LIDARSEG_<SETTING> values the images and manifests set (ENV, compose, Kubernetes) and the
    docs' examples (`LIDARSEG_ACCESS_LOG=auto|json|text|off`: each alternative)."""
    found = set()
    for path in [REPO_ROOT / "Dockerfile", *DEPLOY, *DOCS]:
        for line in text(path).splitlines():
            line = line if path in DOCS else line.split("#", 1)[0]
            for m in re.finditer(
                r"\b(LIDARSEG_[A-Z0-9_]+)(?:=|:\s+|, value:\s*)\"?([\w.|]+)(?!\w|://)", line
            ):
                if m.group(1) in FIELDS:
                    found |= {(m[1], v, rel(path)) for v in m[2].split("|") if v}
    return sorted(found)


@pytest.mark.parametrize("name, value, where", assigned_values())
def test_assigned_values_are_valid_settings(name, value, where):
    """What a manifest sets or a document shows must pass the field's type and bounds."""
    from pydantic import TypeAdapter, ValidationError

    field = Settings.model_fields[FIELDS[name]]
    try:
        TypeAdapter(field.rebuild_annotation()).validate_python(value)
    except ValidationError as e:
        raise AssertionError(f"{where}: {name}={value}: {e}") from None
