"""No import circles among the modules of `shopsim`, `agents` and `baselines`.

grimp (installed with import-linter) reads every import statement, including the ones inside functions and under
``TYPE_CHECKING``, so a circle held together by a function-level import fails here too. A circle is reported with
the importing lines, for example ``shopsim.a -> shopsim.b (l. 12) -> shopsim.a (l. 40)``.
"""

from __future__ import annotations

import grimp  # a dependency of import-linter (the dev extra): no skip, so that CI always runs this

PACKAGES = ("shopsim", "agents", "baselines")


def _circles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
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
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _describe(graph, component: list[str]) -> str:
    """The shortest cycle through the component's first module, with the line of each import."""
    first = component[0]
    cycles = []
    for nxt in sorted(graph.find_modules_directly_imported_by(first) & set(component)):
        back = graph.find_shortest_chain(importer=nxt, imported=first)
        if back:
            cycles.append([first, *back])
    chain = min(cycles, key=len)
    steps = []
    for a, b in zip(chain, chain[1:], strict=False):
        lines = sorted({d["line_number"] for d in graph.get_import_details(importer=a, imported=b)})
        steps.append(f"{b} (l. {', '.join(map(str, lines))} of {a})")
    return f"{first} -> " + " -> ".join(steps)


def test_circles_detected():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b", line_number=1, line_contents="import p.b")
    graph.add_import(importer="p.b", imported="p.c", line_number=2, line_contents="import p.c")
    assert _circles(graph) == []
    graph.add_import(importer="p.c", imported="p.a", line_number=3, line_contents="import p.a")
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]
    assert _describe(graph, ["p.a", "p.b", "p.c"]).startswith("p.a -> p.b (l. 1 of p.a)")


def test_no_import_circles():
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    circles = [_describe(graph, c) for c in _circles(graph)]
    assert not circles, "import circles (break them; an import inside a function still counts):\n" + "\n".join(
        circles)


def test_layer_contracts_list_the_same_core():
    """The core layer of the cross-package contract names the same shopsim modules as the exhaustive one, so that a
    module placed in the core there is also kept below `agents`."""
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]
    by_name = {c.get("containers", [None])[0]: c for c in config["contracts"] if c["type"] == "layers"}

    def names(layer: str) -> set[str]:
        return {m.strip() for m in layer.replace("|", ":").split(":") if m.strip()}

    assert names(by_name[None]["layers"][-1]) == {f"shopsim.{m}" for m in names(by_name["shopsim"]["layers"][-1])}
