"""MkDocs hooks (``hooks:`` in mkdocs.yml): the generated parts of the documentation.

Two pages carry a marker that is replaced as the site is built, so that neither can drift from
the code:

* ``reference/options.md``: ``<!-- pykafka:options -->`` becomes the option reference, rendered
  by :func:`kafka_source.config.catalog.render_markdown` from the catalog the parsers use;
* ``troubleshooting.md``: ``<!-- pykafka:error-messages -->`` becomes every message the package
  raises with one of its own errors, read from the source (:func:`error_messages`), grouped by
  error class, each with the file and line that raises it.

``tests/unit/test_docs_reference.py`` checks both, and that the troubleshooting page explains
every error class the package defines.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kafka_source"
OPTIONS_MARKER = "<!-- pykafka:options -->"
ERRORS_MARKER = "<!-- pykafka:error-messages -->"
BASE_ERROR = "KafkaSourceError"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Message:
    error: str      # the class raised
    text: str       # the message, with {expression} where the f-string has a value
    path: str       # relative to the repository root
    line: int


@functools.lru_cache(maxsize=1)
def _package_sources() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the package, parsed once per build (both lists below walk them)."""
    return tuple((path, ast.parse(path.read_text(), str(path)))
                 for path in sorted(PACKAGE.rglob("*.py"))
                 # the test harness's own errors are not the connector's
                 if "testing" not in path.relative_to(PACKAGE).parts)


def error_classes() -> dict[str, str]:
    """Every public exception class of the package that is a ``KafkaSourceError``: name ->
    module path. Found in the source (class statements whose base is one of them), so a new class
    cannot be missed."""
    bases: dict[str, tuple[str, list[str]]] = {}
    for path, tree in _package_sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases]
                bases[node.name] = (str(path.relative_to(ROOT)), names)
    found = {BASE_ERROR: bases[BASE_ERROR][0]}
    grew = True
    while grew:
        grew = False
        for name, (path, names) in bases.items():
            if name not in found and any(b in found for b in names):
                found[name] = path
                grew = True
    # private classes (a leading underscore) are caught inside the package, never shown
    return {name: path for name, path in found.items() if not name.startswith("_")}


def _text(node: ast.AST) -> str | None:
    """The message an expression builds, with ``{...}`` for what is known only at run time."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{" + ast.unparse(value.value) + "}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return (left or "{...}") + (right or "{...}")
    return None


def error_messages() -> list[Message]:
    """Every ``raise SomeError(message)`` in the package whose class is a ``KafkaSourceError``."""
    classes = error_classes()
    out = []
    for path, tree in _package_sources():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name not in classes:
                continue
            args = node.exc.args
            text = _text(args[0]) if args else None
            out.append(Message(name, text if text is not None else "(built at run time: see "
                               "the source)", str(path.relative_to(ROOT)), node.lineno))
    return sorted(out, key=lambda m: (m.error, m.path, m.line))


def _code(text: str) -> str:
    text = " ".join(text.split())
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def render_error_messages() -> str:
    messages = error_messages()
    out = [f"{len(messages)} messages, read from the source when this site was built. "
           "`{...}` stands for what the message names when it is raised (the option, topic, "
           "partition, offset, broker or value at fault).", ""]
    for error in sorted({m.error for m in messages}):
        mine = [m for m in messages if m.error == error]
        out += [f"**{error}** (see [{error}](#{error.lower()}))", "",
                "| message | raised in |", "|---|---|"]
        out += [f"| {_code(m.text)} | `{m.path}:{m.line}` |" for m in mine]
        out.append("")
    return "\n".join(out)


def on_pre_build(config):  # noqa: ARG001 -- MkDocs' signature
    _package_sources.cache_clear()      # `make docs` rebuilds after edits: read them again


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 -- MkDocs' signature
    uri = page.file.src_uri
    if uri == "reference/options.md":
        from kafka_source.config.catalog import render_markdown

        if OPTIONS_MARKER not in markdown:
            raise ValueError(f"docs/{uri} lost its marker {OPTIONS_MARKER}")
        return markdown.replace(OPTIONS_MARKER, render_markdown())
    if uri == "troubleshooting.md":
        if ERRORS_MARKER not in markdown:
            raise ValueError(f"docs/{uri} lost its marker {ERRORS_MARKER}")
        return markdown.replace(ERRORS_MARKER, render_error_messages())
    return markdown
