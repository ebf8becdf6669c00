"""The documentation's generated parts (docs/hooks.py) and the one version, against the code.

The site itself is built with ``mkdocs build --strict`` in CI (``make docs-build``): a broken
link or a page missing from the navigation fails it. These tests hold what a build cannot
check: that troubleshooting explains every error the package defines, that the generated lists
are complete, and that the version is said the same way everywhere it is said.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest

import kafka_source

pytestmark = pytest.mark.pyspark_free

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("pykafka_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module       # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_troubleshooting_explains_every_error_class_the_package_defines(hooks):
    classes = hooks.error_classes()
    # found in the source, so a new class cannot hide: these are some of them
    assert {"OptionError", "DataLossError", "BrokerSecurityError", "TransactionFencedError",
            "FetchResponseTooLargeError"} <= set(classes)
    page = (DOCS / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^### (\w+)\s*$", page, re.MULTILINE))
    assert sorted(set(classes) - headings) == []
    assert sorted(h for h in headings if h.endswith("Error") and h not in classes) == []
    assert hooks.ERRORS_MARKER in page


def test_every_raise_of_a_package_error_is_listed_with_its_message(hooks):
    messages = hooks.error_messages()
    classes = hooks.error_classes()
    assert len(messages) > 150
    assert {m.error for m in messages} <= set(classes)
    # messages are read from the source: a known one, with its placeholders
    texts = [m.text for m in messages if m.error == "OptionError"]
    assert any(t.startswith("Only one of the options 'subscribe', 'subscribePattern' and "
                            "'assign' may be set") for t in texts)
    assert any("{value}" in t or "{raw}" in t for t in texts)
    # the source file and line of each really raise it
    for m in messages[:: max(1, len(messages) // 25)]:
        line = (ROOT / m.path).read_text().splitlines()[m.line - 1]
        assert "raise" in line and m.error in line, (m, line)
    rendered = hooks.render_error_messages()
    assert rendered.startswith(f"{len(messages)} messages")
    for error in {m.error for m in messages}:
        assert f"**{error}** (see [{error}](#{error.lower()}))" in rendered


def test_the_option_reference_page_is_generated_where_its_marker_is(hooks):
    page = (DOCS / "reference" / "options.md").read_text()
    assert page.count(hooks.OPTIONS_MARKER) == 1

    class File:
        src_uri = "reference/options.md"

    class Page:
        file = File()

    out = hooks.on_page_markdown(page, Page(), None, None)
    assert hooks.OPTIONS_MARKER not in out
    assert "| `kafka.bootstrap.servers` |" in out and "## Streams: the consumer group" in out


def test_the_version_is_in_one_place_and_the_changelog_names_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "kafka_source.__version__"}
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog,
                          re.MULTILINE)
    assert releases and releases[0] == kafka_source.__version__
    assert "## [Unreleased]" in changelog


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert pages and [p for p in pages if f": {p}" not in nav] == []
