"""The one tree of dynaforge's expected errors, in a module without PyTorch (the ONNX rollout and the CLI's
argument handling import it): `DynaforgeError`, and its kinds `ConfigError` (a config or argument that
cannot be used), `DatasetError` (a dataset folder) and `RunError` (a run, study or output folder). Each
message says why and what to do. The command line prints one `error:` line for them; anything else is a bug.

A message that tells the user which option to pass is written once, for both faces: it names the option
with `Option` (and a command with `Command`) inside the text, and each face renders it its own way: the
command line as `--resume`, `--checkpoint last`, `dynaforge train CONFIG --data DIR`; the Python API
(`str(error)`) as `resume=True`, `checkpoint='last'`, `dynaforge.api.train(CONFIG, data=DIR)`.

    raise RunError(f"{root} already holds a run; continue it with {Option('resume', True)}")
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

Face = Literal["cli", "python"]
"""Who reads a message: the command line or Python code (`dynaforge.api`)."""

_MARK = "\x1f"  # the unit separator: never typed by a user, so never in a path or a value
_FIELD = "\x1e"
_MARKED = re.compile(f"{_MARK}([^{_MARK}]*){_MARK}")


class Blank(str):
    """A value the user fills in (CONFIG, DIR), shown as it is by both faces."""


class Option(NamedTuple):
    """An option a message names: its Python argument `name` (the CLI flag is `--name` with dashes) and the
    `value` to pass: True for a switch (`--resume` / `resume=True`), a value (`--checkpoint last` /
    `checkpoint='last'`), a `Blank` (`--data DIR` / `data=DIR`), or None for the option alone (`--out` /
    `out`). `cli`: what the command line says instead, where it has no such flag. Formatted into a
    message's f-string, it marks the place where each face renders it."""

    name: str
    value: bool | str | None = None
    cli: str | None = None

    def __format__(self, spec: str) -> str:
        kind = "blank" if isinstance(self.value, Blank) else type(self.value).__name__
        fields = ["option", self.name, kind, str(self.value or ""), self.cli or ""]
        return _MARK + _FIELD.join(fields) + _MARK

    def __str__(self) -> str:
        return format(self)

    def render(self, face: Face) -> str:
        return render_option(self, face)


class Command(NamedTuple):
    """A dynaforge command a message tells the user to run: `verb` with positional `args` and `options`
    (name -> value), rendered `dynaforge VERB ARG --NAME VALUE` or `dynaforge.api.VERB(ARG, NAME=VALUE)`.
    Only for verbs that `dynaforge.api` has under the same name (generate, train)."""

    verb: str
    args: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = ()

    def __format__(self, spec: str) -> str:
        fields = [self.verb, *(_tagged(a) for a in self.args), "--"]
        fields += [item for name, value in self.options for item in (name, _tagged(value))]
        return f"{_MARK}command{_FIELD}" + _FIELD.join(fields) + _MARK

    def __str__(self) -> str:
        return format(self)


RESUME = Option("resume", True)
OUT = Option("out")
DATA = Option("data", Blank("DIR"))
"""The options most messages name: continue the output there, replace it, write elsewhere, read this data."""


def command(verb: str, *args: object, **options: object) -> Command:
    """A `Command` written as the call it renders to: `command("generate", Blank("CONFIG"), out=root)`;
    paths and other values are shown as text."""
    return Command(verb, tuple(map(_text, args)), tuple((name, _text(v)) for name, v in options.items()))


class DynaforgeError(Exception):
    """An expected failure; its message names the fix. `str(error)` renders it for Python code,
    `render("cli")` for the command line (see the module docstring)."""

    @property
    def message(self) -> str:
        """The message as written, its options marked: for quoting inside another error's message."""
        return str(self.args[0]) if self.args else ""

    def render(self, face: Face) -> str:
        return _MARKED.sub(lambda match: render_marked(match.group(1), face), self.message)

    def __str__(self) -> str:
        return self.render("python")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class ConfigError(DynaforgeError, ValueError):
    """A configuration or argument that cannot be used; the message names the key and what would be valid."""


class DatasetError(DynaforgeError, RuntimeError):
    """A dataset folder that cannot be used or extended as asked; the message says why and what to do."""


class RunError(DynaforgeError, RuntimeError):
    """A run folder (or another output folder) that cannot be used as asked; the message says why and what
    to do."""


def message_for(error: BaseException, face: Face) -> str:
    """`error`'s message as `face` reads it (exceptions outside the tree have one form)."""
    return error.render(face) if isinstance(error, DynaforgeError) else str(error)


# ---- rendering --------------------------------------------------------------------------------------------


def render_option(option: Option, face: Face) -> str:
    name, value = option.name, option.value
    if face == "cli":
        flag = "--" + name.replace("_", "-")
        return option.cli or (flag if value is None or value is True else f"{flag} {value}")
    if value is None:
        return f"`{name}`"
    return f"{name}={_python_value(value)}"


def render_marked(text: str, face: Face) -> str:
    """One marked place of a message (written by `Option.__format__` or `Command.__format__`)."""
    kind, *fields = text.split(_FIELD)
    if kind == "option":
        name, value_kind, value, cli = fields
        parsed = {"bool": True, "NoneType": None, "blank": Blank(value)}.get(value_kind, value)
        return render_option(Option(name, parsed, cli or None), face)
    verb, *rest = fields
    cut = rest.index("--")
    args = [_untagged(a) for a in rest[:cut]]
    options = list(zip(rest[cut + 1 :: 2], (_untagged(v) for v in rest[cut + 2 :: 2]), strict=True))
    if face == "cli":
        words = [f"dynaforge {verb}", *map(str, args), *(f"--{n.replace('_', '-')} {v}" for n, v in options)]
        return " ".join(words)
    inside = [_python_value(a) for a in args] + [f"{n}={_python_value(v)}" for n, v in options]
    return f"dynaforge.api.{verb}({', '.join(inside)})"


def _python_value(value: bool | str) -> str:
    return str(value) if isinstance(value, Blank | bool) else repr(value)


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def _tagged(value: str) -> str:
    return f"blank:{value}" if isinstance(value, Blank) else f"text:{value}"


def _untagged(value: str) -> str:
    kind, text = value.split(":", 1)
    return Blank(text) if kind == "blank" else text
