"""The layers of ARCHITECTURE.md, read from the source: no two modules import each other
(directly or round a longer loop), and the library never imports the command line.

Every import counts: at the top, inside a function, or only for type checking. A module
importing its own package (``costguard.checkpoint`` from ``costguard.checkpoint.store``)
is not a loop: the package is set up before its modules.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import costguard

SOURCE = Path(costguard.__file__).parent
#: The front ends: they may import the CLI's parameter types; nothing else may.
FRONT_ENDS = ("costguard.cli", "costguard.__main__", "costguard.notebook")


def _modules() -> dict[str, Path]:
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = ["costguard", *path.relative_to(SOURCE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of costguard and the modules of costguard it imports (read once per
    session: callers do not change it)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                named = [f"{node.module}.{a.name}" for a in node.names]
                targets = [m for m in named if m in modules] or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name].update(
                t for t in targets if t in modules and t != name and not name.startswith(t + ".")
            )
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_the_loop_finder_finds_a_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert loops(graph) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other() -> None:
    assert loops(import_graph()) == []


def test_the_library_does_not_import_the_command_line() -> None:
    graph = import_graph()
    offenders = {
        name: sorted(t for t in targets if t.startswith("costguard.cli"))
        for name, targets in graph.items()
        if not name.startswith(FRONT_ENDS)
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def _imports_of(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (``costguard.spot``) and the modules *outside* it that it
    imports."""
    inside = (package, f"{package}.")
    return {
        name: {t for t in targets if not t.startswith(inside) and t != package}
        for name, targets in import_graph().items()
        if name.startswith(inside) or name == package
    }


def _reaching(package: str, *others: str) -> dict[str, list[str]]:
    """The modules of ``package`` that import one of ``others``, with what they import."""
    found = {
        name: sorted(t for t in targets if t.startswith(others))
        for name, targets in _imports_of(package).items()
    }
    return {name: targets for name, targets in found.items() if targets}


#: The ground floor: what any layer may import.
GROUND = {
    "costguard", "costguard.errors", "costguard.settings", "costguard.retry", "costguard.files",
    "costguard.money", "costguard.shell", "costguard.secrets", "costguard.tags",
}  # fmt: skip


def test_the_cloud_helpers_stand_on_the_ground() -> None:
    """clouds/ (client factories, error and timestamp readers) serves every adapter, so it
    imports none of them."""
    above = {name: sorted(t - GROUND) for name, t in _imports_of("costguard.clouds").items()}
    assert {name: targets for name, targets in above.items() if targets} == {}


def test_the_reaper_knows_nothing_of_launch_checkpoints_or_billing() -> None:
    assert (
        _reaching(
            "costguard.reaper",
            "costguard.spot",
            "costguard.checkpoint",
            "costguard.billing",
            "costguard.alarms",
        )
        == {}
    )


def test_launch_knows_nothing_of_the_reaper_alarms_or_billing() -> None:
    assert (
        _reaching("costguard.spot", "costguard.reaper", "costguard.alarms", "costguard.billing")
        == {}
    )


def test_the_launcher_base_and_the_adapters_do_not_import_one_another() -> None:
    adapters = tuple(f"costguard.spot.launcher.{c}" for c in ("aws", "gcp", "azure", "local"))
    graph = import_graph()
    for name in ("costguard.spot.launcher.base", "costguard.spot.launcher.options", *adapters):
        assert not graph[name] & set(adapters), name


def test_checkpoints_know_nothing_of_launch_the_reaper_or_the_cli() -> None:
    """Every module of checkpoint/, ``costguard run``'s supervisor too: what it shares with
    launch and the agent (the job's exit record, the jobs folder) is the job contract's."""
    assert (
        _reaching("costguard.checkpoint", "costguard.cli", "costguard.spot", "costguard.reaper")
        == {}
    )
