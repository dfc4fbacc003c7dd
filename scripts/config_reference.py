"""Write docs/config.md: every config key with its default and meaning, read from the config dataclasses.

    python scripts/config_reference.py          # rewrite docs/config.md
    python scripts/config_reference.py --check  # exit 1 if docs/config.md is not what the code says

The meaning of a key is the docstring written under its field; a section's text is its class docstring.
Sections chosen by name (`system`, `model`) list every choice; the systems are read from the
registry, `dynaforge.systems.SYSTEMS`. tests/unit/test_config_reference.py checks
that the committed file is current.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import json
import sys
import textwrap
import typing
from functools import cache
from pathlib import Path
from typing import Any

from dynaforge.config import MODEL_CONFIGS, Config, MixtureMember
from dynaforge.systems import SYSTEMS

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"

HEADER = """# Configuration reference

Every key of a dynaforge config, its default and what it means, generated from the config dataclasses by
`python scripts/config_reference.py` (a test fails when this file is out of date). A config is a YAML file
of these sections (see `configs/` for presets); any key can be set on the command line as `section.key=value`
(`train.lr=0.002`, `model.width=64`). Keys are checked when the config loads: a wrong name or value is refused
with the key and what would be valid.
"""

USER_SYSTEMS = """
### `system.name: package.module:Class`

A system of your own, in your own package, named by import path: its class derives
`dynaforge.systems.base.SystemBase` and its section is its `config_class`; see
[user-systems.md](user-systems.md).
"""


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it, for `cls` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass.__module__ == "builtins":
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def shown(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)  # type: ignore[arg-type]
    if isinstance(value, dict | list):
        return "`" + json.dumps(value, default=plain).replace('"', "") + "`"
    return "`" + str(value).replace("'", "").replace("|", "\\|") + "`"


def plain(value: Any) -> Any:
    """A nested default json cannot write (a dataclass in a list) as a dict."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def rows(cls: type, prefix: str) -> list[tuple[str, str, str]]:
    """(key, default, meaning) of every field of `cls`, nested sections flattened with dotted keys."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    out: list[tuple[str, str, str]] = []
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        value = default_of(field)
        if dataclasses.is_dataclass(kind) and isinstance(kind, type) and not is_value(kind):
            out.append((f"{prefix}{field.name}", "(section)", docs.get(field.name, "")))
            out.extend(rows(kind, f"{prefix}{field.name}."))
            continue
        out.append((f"{prefix}{field.name}", shown(value), docs.get(field.name, "")))
    return out


def is_value(cls: type) -> bool:
    """Small dataclasses written as one value (`Range`: {low, high, log})."""
    return cls.__name__ in {"Range"}


def table(entries: list[tuple[str, str, str]]) -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, default, meaning in entries:
        escaped = meaning.replace("|", "\\|")
        lines.append(f"| `{key}` | {default} | {escaped} |")
    return "\n".join(lines) + "\n"


def class_text(cls: type) -> str:
    return inspect.cleandoc(cls.__doc__ or "")


def section(name: str, cls: type, doc: str) -> str:
    text = f"## `{name}`\n\n{doc}\n\n{class_text(cls)}\n\n"
    return text + table(rows(cls, f"{name}."))


def chosen_sections(name: str, choices: dict[str, type], doc: str) -> str:
    text = f"## `{name}`\n\n{doc} Chosen by `{name}.name`: {', '.join(f'`{c}`' for c in choices)}.\n"
    for choice, cls in choices.items():
        text += f"\n### `{name}.name: {choice}`\n\n{class_text(cls)}\n\n" + table(rows(cls, f"{name}."))
    return text


def list_section(name: str, cls: type, doc: str) -> str:
    """A section that is a list of `cls` items (default: empty), each item's keys as `name[i].key`; an item's
    `system` is any `system` section above."""
    text = f"## `{name}`\n\n{doc} Default: `[]`.\n\n{class_text(cls)}\n\n"
    docs = field_docs(cls)
    entries = [
        (
            f"{name}[i].{f.name}",
            "(section)" if f.name == "system" else shown(default_of(f)),
            docs.get(f.name, ""),
        )
        for f in dataclasses.fields(cls)
    ]
    return text + table(entries)


def render() -> str:
    docs = field_docs(Config)
    parts = [HEADER]
    for field in dataclasses.fields(Config):
        doc = docs.get(field.name, "")
        if field.name == "system":
            choices = {name: system.config_class for name, system in SYSTEMS.items()}
            parts.append(chosen_sections("system", choices, doc) + USER_SYSTEMS)
        elif field.name == "model":
            parts.append(chosen_sections("model", dict(MODEL_CONFIGS), doc))
        elif field.name == "mixture":
            parts.append(list_section("mixture", MixtureMember, doc))
        else:
            parts.append(section(field.name, typing.get_type_hints(Config)[field.name], doc))
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/config.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is out of date: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
