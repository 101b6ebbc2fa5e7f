"""Sphinx configuration of contrastkit's API reference.

Build: ``python -m sphinx -W --keep-going -b html docs/api OUT`` (``tests/test_api_docs.py``
does this and fails on any warning).

Why Sphinx (autodoc + napoleon) and not mkdocs-material + mkdocstrings: the docstrings are
reStructuredText (double-backquoted literals, ``:func:`` / ``:class:`` / ``:mod:`` roles) with
Google-style ``Args:`` / ``Returns:`` / ``Raises:`` sections. Sphinx reads both natively and
resolves the roles against the documented objects, so a reference to a name that does not
exist is a warning, and ``-W`` makes it an error; mkdocstrings would need the docstrings
rewritten in Markdown, or would leave the roles unchecked. It needs nothing beyond Sphinx.

Each page runs ``automodule`` on one public package (``contrastkit.losses``, ...), which
documents exactly that package's ``__all__`` under the public names
(``contrastkit.losses.nt_xent``), never the internal module files, so moving code between files
inside a package does not change the reference. Constants that autodoc would leave out are
added as ``autodata``, and a name in a documented package's ``__all__`` that no page documents
is a warning.

Cross-references are checked (``nitpicky``) for contrastkit's own names only:

* a reference to contrastkit's name that is not documented under it, e.g. written with its
  internal path (``:mod:`contrastkit.metrics.probe```, ``:class:`contrastkit.losses.core.X```)
  or relative to the file it is written in, is redirected to the public name that documents the
  same object (a module: the page of the nearest documented package); it still has to import,
  so a stale path after a move fails the build;
* a reference that resolves to someone else's object (``torch.Tensor``, ``numpy.ndarray``,
  ``int``, ``typing`` constructs) is not linked and not warned about: there are no external
  inventories to link to (the build must work offline);
* anything else (a name that does not exist, or a contrastkit name that no page documents)
  is a warning, so the build fails.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import re
import os
import sys
import typing
from typing import Any, Iterator, List, Optional, Tuple

from docutils import nodes
from sphinx import addnodes
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

# Document the working tree's package, not whatever copy is installed.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src")))

project = "contrastkit"
author = "the contrastkit authors"
copyright = "the contrastkit authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["README.md"]
html_theme = "alabaster"
nitpicky = True

autodoc_default_options = {
    "members": True,
    "undoc-members": True,       # everything in __all__ is public, docstring or not
    "member-order": "bysource",  # a package's __all__ order
    "show-inheritance": True,
}
# torch's own docstrings (nn.Module.forward, ...) are not contrastkit's to document.
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# ``Attributes:`` sections as fields of the class, not a second description of each attribute.
napoleon_use_ivar = True

#: Explicit exceptions to the reference check, as (role type, target) pairs.
nitpick_ignore: List[Tuple[str, str]] = [
    # The losses' ``temperature`` type (a number, a 0-d tensor or a Temperature module) is an
    # alias in an internal module that no package exports; exporting it from contrastkit.losses
    # would make it a documented, linked name and this entry unnecessary.
    ("py:class", "TemperatureLike"),
]

_MISSING = object()
_OURS = "contrastkit"


def _import(dotted: str) -> Any:
    """The object a dotted name names (modules imported on the way), or ``_MISSING``."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # not a module (or one that fails to import): try a shorter prefix
            continue
        return _lookup(obj, parts[i:])
    return getattr(builtins, dotted, _MISSING) if dotted else _MISSING


def _lookup(namespace: Any, names: List[str]) -> Any:
    """``namespace.a.b`` for ``names = ["a", "b"]``, or ``_MISSING``."""
    obj = namespace
    for name in names:
        obj = getattr(obj, name, _MISSING)
        if obj is _MISSING:
            break
    return obj


def _namespaces(node: nodes.Element) -> Iterator[Tuple[Any, str]]:
    """Where a reference's name may be defined, innermost first, each with its owner's name.

    The enclosing documented object (its class chain and the module its code lives in), then
    the ``py:module`` / ``py:class`` context Sphinx recorded, then builtins.
    """
    parent = node.parent
    while parent is not None and not isinstance(parent, addnodes.desc):
        parent = parent.parent
    if parent is not None:
        for sig in parent.findall(addnodes.desc_signature):
            module, fullname = sig.get("module"), sig.get("fullname")
            if not module or not fullname:
                continue
            chain = fullname.split(".")
            for i in range(len(chain), 0, -1):
                obj = _import(module + "." + ".".join(chain[:i]))
                if obj is not _MISSING:
                    yield obj, getattr(obj, "__module__", module) or module
            obj = _import(module + "." + fullname)
            real = sys.modules.get(getattr(obj, "__module__", None) or "")
            if real is not None:
                yield real, real.__name__
            break
    module = node.get("py:module")
    if module:
        if node.get("py:class"):
            obj = _import(module + "." + node["py:class"])
            if obj is not _MISSING:
                yield obj, module
        obj = _import(module)
        if obj is not _MISSING:
            yield obj, module
        # The package's internal modules, for names used in code that lives there.
        yield from _submodules(module)
    yield builtins, "builtins"


_SUBMODULES: dict = {}


def _submodules(module: str) -> List[Tuple[Any, str]]:
    """(module object, name) of the loaded modules inside ``module``, by name: worked out once
    for each number of loaded modules (asked for every reference, sorting all of ``sys.modules``
    each time was most of the build)."""
    loaded = len(sys.modules)
    known = _SUBMODULES.get(module)
    if known is None or known[0] != loaded:
        prefix = module + "."
        inside = sorted((name, submodule) for name, submodule in list(sys.modules.items())
                        if name.startswith(prefix) and submodule is not None)
        known = _SUBMODULES[module] = (loaded, [(submodule, name) for name, submodule in inside])
    return known[1]


def _resolve(node: nodes.Element) -> Tuple[Any, str]:
    """The Python object a reference names and the module that owns it (or ``_MISSING``)."""
    target = node["reftarget"].lstrip(".~")
    for namespace, owner in _namespaces(node):
        obj = _lookup(namespace, target.split("."))
        if obj is not _MISSING:
            return obj, _owner(obj, owner)
    obj = _import(target)
    return obj, _owner(obj, target)


def _owner(obj: Any, found_in: str) -> str:
    """The module a thing belongs to: a module itself, a class's or function's defining module,
    otherwise (a constant, a type alias) the module it was found in."""
    if isinstance(obj, type(sys)):
        return obj.__name__
    if typing.get_origin(obj) is not None:  # an alias such as Union[bool, ProcessGroup]
        return found_in
    if isinstance(obj, type) or callable(obj):
        return getattr(obj, "__module__", None) or found_in
    return found_in


def _is_ours(module: str) -> bool:
    return module == _OURS or module.startswith(_OURS + ".")


def _documented(env: Any) -> List[Tuple[Any, str, str]]:
    """(object, full name, object type) for everything the pages document, built once."""
    cache = getattr(env, "_contrastkit_documented", None)
    if cache is None:
        cache = []
        for name, entry in env.get_domain("py").objects.items():
            obj = _import(name)
            if obj is not _MISSING:
                cache.append((obj, name, entry.objtype))
        env._contrastkit_documented = cache
    return cache


def _public_name(env: Any, obj: Any, target: str) -> Optional[str]:
    """The documented name of ``obj``: the same object under its public name, or for a module
    the nearest documented package above it."""
    documented = _documented(env)
    if isinstance(obj, type(sys)):
        parts = obj.__name__.split(".")
        modules = {name for _, name, objtype in documented if objtype == "module"}
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in modules:
                return ".".join(parts[:i])
        return None
    same = [name for other, name, _ in documented if other is obj]
    last = target.rsplit(".", 1)[-1]
    same.sort(key=lambda name: name.rsplit(".", 1)[-1] != last)  # same final name first
    return same[0] if same else None


def _redirect(app: Any, env: Any, node: nodes.Element, contnode: nodes.Node) -> Optional[nodes.Node]:
    """``missing-reference``: link contrastkit's own objects under their documented names."""
    if node.get("refdomain") != "py":
        return None
    obj, owner = _resolve(node)
    if obj is _MISSING or not _is_ours(owner):
        return None
    name = _public_name(env, obj, node["reftarget"])
    if name is None:
        return None
    reftype = "mod" if isinstance(obj, type(sys)) else "obj"
    return env.get_domain("py").resolve_xref(env, node.get("refdoc", ""), app.builder, reftype,
                                             name, node, contnode)


def _external(app: Any, domain: Any, node: nodes.Element) -> Optional[bool]:
    """``warn-missing-reference``: stay quiet about other packages' objects only."""
    if node.get("refdomain") != "py":
        return None
    obj, owner = _resolve(node)
    if obj is not _MISSING and not _is_ours(owner):
        return True
    return None


def _parseable_signature(app: Any, what: str, name: str, obj: Any, options: Any,
                         signature: Optional[str], return_annotation: Optional[str]) -> Any:
    """A dataclass field's ``default_factory`` shows as ``=<factory>``, which Sphinx cannot
    parse (it then splits the signature at every comma, ``Dict[str, ...`` included)."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), return_annotation
    return None


def _no_type_docstring(app: Any, what: str, name: str, obj: Any, options: Any,
                       lines: List[str]) -> None:
    """A constant without a comment would show its type's docstring (``dict``'s): drop it."""
    if what in ("data", "attribute") and not inspect.isclass(obj):
        type_doc = inspect.getdoc(type(obj)) or ""
        if type_doc and "\n".join(lines).strip() == type_doc.strip():
            lines.clear()


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: List[type]) -> None:
    """Show a private base class (``_LossModule``) as the public classes it derives from."""
    public: List[type] = []
    pending = list(bases)
    while pending:
        base = pending.pop(0)
        if base.__name__.startswith("_") and _is_ours(base.__module__):
            pending[:0] = list(base.__bases__)
        elif base not in public:
            public.append(base)
    bases[:] = public


_AUTOMODULE = re.compile(r"^\.\. automodule:: *(\S+)", re.M)


def _undocumented_constants(package: str) -> List[Tuple[str, List[str]]]:
    """The constants in ``package.__all__`` that ``automodule`` leaves out, each with the ``#:``
    comment that documents it where it is assigned.

    autodoc documents every class and function in ``__all__``, but a constant only where the
    package's own source assigns it with a ``#:`` comment; the others (re-exported from an
    internal module, or without a comment) get an explicit ``autodata``.
    """
    module = importlib.import_module(package)
    imported_from = {}
    for stmt in ast.parse(inspect.getsource(module)).body:
        if isinstance(stmt, ast.ImportFrom):
            source = stmt.module or ""
            if stmt.level:
                source = importlib.util.resolve_name("." * stmt.level + source, package)
            for alias in stmt.names:
                imported_from[alias.asname or alias.name] = source
    found = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
            continue
        where = imported_from.get(name, package)
        comment = ModuleAnalyzer.for_module(where).find_attr_docs().get(("", name))
        if where == package and comment:
            continue
        found.append((name, [line for line in comment or [] if line.strip()]))
    return found


def _add_reexported_data(app: Any, docname: str, source: List[str]) -> None:
    """``source-read``: append an ``autodata`` for each constant ``automodule`` leaves out."""
    extra = []
    for package in _AUTOMODULE.findall(source[0]):
        for name, comment in _undocumented_constants(package):
            value = repr(getattr(importlib.import_module(package), name))
            extra.append(f"\n.. autodata:: {package}.{name}\n")
            if len(value) > 100:  # a long literal (the explorer's presets) says nothing here
                extra.append("   :no-value:\n")
            extra.append("\n" + "".join(f"   {line}\n" for line in comment))
    source[0] += "".join(extra)


def _check_complete(app: Any, env: Any) -> None:
    """``env-check-consistency``: every name in a documented package's ``__all__`` has an entry."""
    objects = env.get_domain("py").objects
    for name, entry in list(objects.items()):
        if entry.objtype != "module" or not _is_ours(name):
            continue
        for public in getattr(importlib.import_module(name), "__all__", ()):
            if f"{name}.{public}" not in objects:
                logging.getLogger(__name__).warning(
                    "%s.%s is in %s.__all__ but the API reference does not document it",
                    name, public, name, location=entry.docname)


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _parseable_signature)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-docstring", _no_type_docstring)
    app.connect("source-read", _add_reexported_data)
    app.connect("env-check-consistency", _check_complete)
    app.connect("missing-reference", _redirect)
    app.connect("warn-missing-reference", _external)
