"""The package's structure, checked from its source: no import circle, the library apart from
the trainer, no private name taken from another package, one storage test (held or streamed)
and only inside ``contrastkit.data``.

Every ``import`` / ``from ... import`` of the package is read with :mod:`ast`, wherever it
stands in a file (a function-level import is an import all the same), except under
``if TYPE_CHECKING:`` (annotations only, never run).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

import contrastkit

ROOT = Path(contrastkit.__file__).parent
PACKAGE = "contrastkit"

#: The library: what a script or the Lightning integration trains with.
LIBRARY = {"losses", "distributed", "models", "metrics", "data", "methods", "analysis", "temperature", "compat",
           "temperature_methods", "layout", "run_writer",
           "_io", "manifest", "config_files", "extras", "records"}
#: The trainer and the tools on top of it.
TRAINER = {"train", "studies", "commands", "cli", "report", "__main__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str) -> List[Tuple[str, List[str]]]:
    """``(imported module, names taken from it)`` for every import of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: List[Tuple[str, List[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [alias.name for alias in node.names]
            if target.startswith(PACKAGE):
                # ``from package import module`` imports the module
                modules = [f"{target}.{name}" for name in names if (ROOT.parent / f"{target}.{name}".replace(".", "/")).with_suffix(".py").exists()
                           or (ROOT.parent / f"{target}.{name}".replace(".", "/") / "__init__.py").exists()]
                found.extend((m, []) for m in modules)
                rest = [n for n in names if f"{target}.{n}" not in modules]
                if rest or not modules:
                    found.append((target, rest))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [(target, names) for target, names in found if target == PACKAGE or target.startswith(PACKAGE + ".")]


def _graph() -> Tuple[Dict[str, Set[str]], Dict[str, List[Tuple[str, List[str]]]]]:
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    edges: Dict[str, Set[str]] = {name: set() for name in modules}
    raw: Dict[str, List[Tuple[str, List[str]]]] = {}
    for name, path in modules.items():
        raw[name] = _imports(path, name)
        for target, _ in raw[name]:
            if target in modules and target != name:
                edges[name].add(target)
    return edges, raw


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return components


def test_the_package_has_no_import_circle():
    edges, _ = _graph()
    assert _cycles(edges) == []


def test_the_library_imports_nothing_of_the_trainer():
    _, raw = _graph()
    violations = [(module, target) for module, imports in raw.items() if _layer(module) in LIBRARY
                  for target, _ in imports if _layer(target) in TRAINER]
    assert violations == []


def test_the_lightning_integration_imports_only_the_library():
    _, raw = _graph()
    imported = {_layer(target) for target, _ in raw["contrastkit.integrations.lightning"]}
    assert imported <= LIBRARY, imported - LIBRARY


def test_no_module_takes_a_private_name_of_another_package():
    """A private name (``_name``, or a ``_module``) of ``contrastkit.X`` is used only inside
    ``contrastkit.X``; ``contrastkit._io`` is the root package's own helpers, shared by all."""
    _, raw = _graph()
    violations = []
    for module, imports in raw.items():
        for target, names in imports:
            owner = _layer(target)
            if owner == "_io" or owner == _layer(module):
                continue
            private_module = any(part.startswith("_") and part != "__init__" for part in target.split(".")[1:])
            private_names = [name for name in names if name.startswith("_") and not name.startswith("__")]
            if private_module or private_names:
                violations.append((module, target, private_names))
    assert violations == []


def test_only_the_data_package_asks_how_a_split_is_stored():
    offenders = []
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        if _layer(module) == "data":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
                node.name if isinstance(node, ast.alias) else None
            if name in ("in_memory", "is_streaming"):
                offenders.append(f"{module}:{getattr(node, 'lineno', '?')}")
    assert offenders == []


@pytest.mark.parametrize("kind", ["circle", "upward", "private"])
def test_the_checks_see_a_violation(kind, tmp_path):
    """The checks above fail on the violations they are for (a planted module)."""
    global ROOT
    tree = tmp_path / PACKAGE
    (tree / "methods").mkdir(parents=True)
    (tree / "train").mkdir()
    (tree / "data").mkdir()
    for folder in (tree, tree / "methods", tree / "train", tree / "data"):
        (folder / "__init__.py").write_text("")
    (tree / "train" / "loop.py").write_text("from contrastkit.methods import base\n")
    (tree / "data" / "files.py").write_text("def _helper():\n    pass\n")
    if kind == "circle":
        (tree / "methods" / "base.py").write_text("from . import config\n")
        (tree / "methods" / "config.py").write_text("def f():\n    from .base import x\n")
    elif kind == "upward":
        (tree / "methods" / "base.py").write_text("from contrastkit.train import loop\n")
    else:
        (tree / "methods" / "base.py").write_text("from contrastkit.data.files import _helper\n")
    ROOT, saved = tree, ROOT
    try:
        edges, raw = _graph()
        if kind == "circle":
            assert _cycles(edges) == [["contrastkit.methods.base", "contrastkit.methods.config"]]
        elif kind == "upward":
            assert {(m, t) for m, imports in raw.items() if _layer(m) in LIBRARY
                    for t, _ in imports if _layer(t) in TRAINER} == {("contrastkit.methods.base", "contrastkit.train.loop")}
        else:
            assert raw["contrastkit.methods.base"] == [("contrastkit.data.files", ["_helper"])]
    finally:
        ROOT = saved


@pytest.mark.parametrize("command, function", [("embed", "export_embeddings"), ("export", "export_model"),
                                                ("neighbors", "find_neighbors")])
def test_the_trainer_module_behind_a_command_is_named_after_it(command, function):
    """``contrastkit embed`` ran ``train/export.py`` and ``contrastkit export`` ran ``train/export_model.py``."""
    import importlib

    assert hasattr(importlib.import_module(f"contrastkit.train.{command}"), function)


def test_one_spelling_of_neighbors():
    """The CLI says ``neighbors``; the code, its output and the docs say it the same way."""
    root = Path(__file__).resolve().parents[1]
    spelt = [str(path.relative_to(root)) for folder in ("src", "docs") for path in (root / folder).rglob("*")
             if path.is_file() and path.suffix in (".py", ".md", ".rst", ".js", ".html", ".css")
             and "neighbou" in path.read_text(encoding="utf-8", errors="replace").lower()]
    assert not spelt, spelt


#: The result keys only :mod:`contrastkit.records` spells out; every other module uses its names.
#: (``knn_accuracy`` is also a function's name, so not checked.)
RECORD_LITERALS = ("probe_accuracy", "view_retrieval_top1", "random_init_", "raw_pixel_")


def _record_literals(root: Path) -> List[str]:
    """``module:line`` of each string constant (docstrings aside) that is a record key of
    :data:`RECORD_LITERALS` or starts with a baseline's prefix, outside ``contrastkit.records``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        if module == f"{PACKAGE}.records":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if node.value in RECORD_LITERALS[:2] or node.value.startswith(RECORD_LITERALS[2:]):
                    found.append(f"{module}:{node.lineno}")  # (an f-string's parts are constants too)
    return found


def test_record_keys_are_spelled_only_in_the_records_module():
    assert _record_literals(ROOT) == []


def test_the_record_literal_check_sees_a_literal(tmp_path):
    tree = tmp_path / PACKAGE
    tree.mkdir()
    (tree / "records.py").write_text('PROBE_ACCURACY = "probe_accuracy"\n')
    (tree / "table.py").write_text('"""Reads probe_accuracy."""\nKEY = "probe_accuracy"\nBASE = f"raw_pixel_{KEY}"\n')
    assert _record_literals(tree) == [f"{PACKAGE}.table:2", f"{PACKAGE}.table:3"]


def test_only_the_writers_keep_a_manifest():
    """Every file contrastkit writes goes through a writer of ``contrastkit.run_writer``: no other
    module constructs a folder's ``Manifest`` (``contrastkit.manifest`` reads nested ones while
    planning a removal)."""
    makers = []
    for path in ROOT.rglob("*.py"):
        module = _module_name(path)
        if module in ("contrastkit.run_writer", "contrastkit.manifest"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else \
                    node.func.attr if isinstance(node.func, ast.Attribute) else None
                if called == "Manifest":
                    makers.append(f"{module}:{node.lineno}")
    assert makers == []


# -- the configuration keeps no state beside its fields ------------------------------------

#: The layers that receive a resolved configuration and must not change it.
_CONFIG_READERS = ("train", "integrations", "commands", "studies", "report")


def _config_state_violations(source: str, module: str) -> List[str]:
    """In one module's source: a read of ``__dict__`` (state hidden beside the fields), or, in a
    layer that receives a resolved configuration, an assignment to an attribute of ``config``
    / ``c`` / ``<...>.config`` (a configuration changed after resolving)."""
    found = []
    reader = module.split(".")[1] in _CONFIG_READERS if "." in module else False
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            found.append((node.lineno, f"{module}:{node.lineno}: reads __dict__"))
        if reader and isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and (
                            (isinstance(part.value, ast.Name) and part.value.id in ("config", "c"))
                            or (isinstance(part.value, ast.Attribute) and part.value.attr == "config")):
                        found.append((node.lineno, f"{module}:{node.lineno}: assigns {ast.unparse(part)}"))
    return [text for _, text in sorted(found)]


def test_no_configuration_state_beside_its_fields_and_no_change_after_resolving():
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        violations += _config_state_violations(path.read_text(encoding="utf-8"), _module_name(path))
    assert violations == []


def test_the_configuration_state_check_sees_a_violation():
    planted = ("def f(config, run):\n    schedule = config.__dict__.get('_schedule')\n"
               "    config.batch_size = 8\n    run.plan.config.epochs = 2\n")
    found = _config_state_violations(planted, "contrastkit.train.planted")
    assert [line.split(": ", 1)[1] for line in found] == [
        "reads __dict__", "assigns config.batch_size", "assigns run.plan.config.epochs"]
    assert _config_state_violations(planted.replace("config.batch_size = 8", "x = 1"),
                                    "contrastkit.methods.planted") == ["contrastkit.methods.planted:2: reads __dict__"]


def _named_comparisons(source: str, names) -> List[str]:
    """Comparisons of a value with one of ``names`` (a method's or a data set's name) in code."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for part in ast.walk(node):
                if isinstance(part, ast.Constant) and part.value in names:
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_configuration_code_names_no_method_and_no_data_set():
    """What depends on the method is asked of the method, a data set's name of the data layer."""
    from contrastkit.data import data_sources
    from contrastkit.methods import method_names

    names = set(method_names()) | {source.name for source in data_sources()}
    source = (ROOT / "methods" / "config.py").read_text(encoding="utf-8")
    assert _named_comparisons(source, names) == []
    assert _named_comparisons("if c.method != 'moco':\n    pass\n", names) == ["1: c.method != 'moco'"]
