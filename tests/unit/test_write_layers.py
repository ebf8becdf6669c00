"""The write path's module seams (:mod:`kafka_source.write`), read from the source with ``ast``.

``kafka_source/write/`` is a one-way flow -- writer -> task / exactly_once -> producer ->
transactions / ending / sending -> batches -> produce_errors / clock -> wire/ -- whose modules
use each other's public names only, and ``kafka_source/config/`` sits below it. Every import
statement counts: at module level, inside functions (lazy imports) and under
``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.pyspark_free

PACKAGE = Path(__file__).resolve().parents[2] / "kafka_source"
WRITE = PACKAGE / "write"
CONFIG = PACKAGE / "config"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, str | None, int]]:
    """Every import of ``path`` as (module imported from, name or None, line): ``from m import
    a`` gives (m, a); ``import m`` gives (m, None); relative imports resolved."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found += [(source, alias.name, node.lineno) for alias in node.names]
    return found


def _targets(source: str, name: str | None) -> list[str]:
    """The kafka_source modules that an import of ``name`` from ``source`` may load: ``from
    kafka_source.write import producer`` loads kafka_source.write.producer."""
    if name is None or name == "*":
        return [source]
    return [source, f"{source}.{name}"]


def _write_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(WRITE.glob("*.py"))}


def _write_graph() -> dict[str, set[str]]:
    modules = _write_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for source, name, _ in _imports(path):
            for target in _targets(source, name):
                if target in modules and target != module and target != "kafka_source.write":
                    graph[module].add(target)
    return graph


def _public_names(path: Path) -> set[str] | None:
    """The strings of the module's ``__all__``, None without one."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def test_the_import_parser_sees_the_write_modules_imports():
    # Guards the tests below against passing because nothing was found.
    graph = _write_graph()
    assert "kafka_source.write.sending" in graph["kafka_source.write.producer"]
    assert "kafka_source.write.task" in graph["kafka_source.write.writer"]          # lazy
    assert "kafka_source.write.producer" in graph["kafka_source.write.exactly_once"]  # lazy
    assert "kafka_source.write.producer" in graph["kafka_source.write.producer_pool"]


def test_write_modules_import_no_private_name_of_another_module():
    private = []
    for module, path in _write_modules().items():
        for source, name, line in _imports(path):
            if not source.startswith("kafka_source"):
                continue
            hidden = [part for part in source.split(".") + ([name] if name else [])
                      if part.startswith("_") and part != "__init__"]
            if hidden:
                private.append(f"{path.relative_to(PACKAGE.parent)}:{line}: "
                               f"from {source} import {name}")
    assert not private, "private names imported across modules:\n" + "\n".join(private)


def test_names_used_across_write_modules_are_in_their_all():
    modules = _write_modules()
    missing = []
    for module, path in modules.items():
        for source, name, line in _imports(path):
            if source not in modules or source == module or name is None \
                    or f"{source}.{name}" in modules:
                continue
            public = _public_names(modules[source])
            if public is None or name not in public:
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} "
                               f"is not in {source}.__all__")
    assert not missing, "\n".join(missing)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_write_modules_import_each_other_one_way():
    cycle = _cycle(_write_graph())
    assert cycle is None, "import cycle: " + " -> ".join(m.rsplit(".", 1)[1] for m in cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("path", sorted(CONFIG.glob("*.py")), ids=lambda p: p.name)
def test_config_imports_nothing_from_write(path):
    wrong = [f"{path.name}:{line}: from {source} import {name}"
             for source, name, line in _imports(path)
             if any(target == "kafka_source.write" or target.startswith("kafka_source.write.")
                    for target in _targets(source, name))]
    assert not wrong, "config/ must not depend on write/:\n" + "\n".join(wrong)
