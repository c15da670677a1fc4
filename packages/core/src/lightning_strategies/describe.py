"""Parameter documentation of a strategy class, read from its source without importing it.

`lightning-strategies info` must not import a backend, yet users want each default with its
meaning. The class's source is parsed: ``__init__``'s defaults, and the Google-style ``Args:``
section of the class or ``__init__`` docstring. A class that writes no ``__init__`` of its own has the one of
its first base that does (a body shared by a Trainer and a Fabric strategy), or, where it assigns
``__init__ = constructor_for(__qualname__, Base.__init__, old="new")`` or
``__init__ = rename_parameter(Base.__init__, "old", "new")``, that one with the parameters renamed.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass

_ARG_LINE = re.compile(r"^(\s*)(\*{0,2}\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$")


@dataclass
class ParameterDoc:
    name: str
    default: str | None
    meaning: str


# How many classes up a constructor is looked for: a face, its body, and what the body builds on.
_MAX_DEPTH = 4


def parameter_docs(target: str, _depth: int = 0) -> list[ParameterDoc]:
    """Parameters of ``"module:Class"``'s constructor; empty when the source cannot be read."""
    module_name, _, class_name = target.partition(":")
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    with open(spec.origin, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return _class_parameters(node, _Module(module_name, spec.origin, tree), _depth)
    return []


@dataclass
class _Module:
    name: str
    path: str
    tree: ast.Module

    def target_of(self, class_name: str) -> str | None:
        """``"module:Class"`` for a class this module defines or imports by name from its own top-level package.

        Only there: looking a module up imports its package, and another package may be Lightning, or a backend.
        """
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return f"{self.name}:{class_name}"
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    module = self._absolute(node)
                    if (alias.asname or alias.name) == class_name and module.split(".")[0] == self.name.split(".")[0]:
                        return f"{module}:{alias.name}"
        return None

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        is_package = self.path.endswith("__init__.py")
        parts = self.name.split(".")[: len(self.name.split(".")) - node.level + is_package]
        return ".".join([*parts, node.module] if node.module else parts)


def _class_parameters(node: ast.ClassDef, module: _Module, depth: int) -> list[ParameterDoc]:
    init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
    if init is None:
        meanings = _args_section(ast.get_docstring(node) or "")
        inherited = _inherited_parameters(node, module, depth)
        return [ParameterDoc(doc.name, doc.default, meanings.get(doc.name) or doc.meaning) for doc in inherited]
    meanings = {
        **_args_section(ast.get_docstring(node) or ""),
        **_args_section(ast.get_docstring(init) or ""),
    }
    arguments = init.args
    positional = arguments.posonlyargs + arguments.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(arguments.defaults)) + list(arguments.defaults)
    pairs = list(zip(positional, defaults, strict=True)) + list(
        zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True)
    )
    return [
        ParameterDoc(arg.arg, ast.unparse(default) if default is not None else None, meanings.get(arg.arg, ""))
        for arg, default in pairs
        if arg.arg != "self"
    ]


def _inherited_parameters(node: ast.ClassDef, module: _Module, depth: int) -> list[ParameterDoc]:
    if depth >= _MAX_DEPTH:
        return []
    copied = _copied_constructor(node)
    if copied is not None:
        base_name, renamed = copied
        target = module.target_of(base_name)
        documented = parameter_docs(target, depth + 1) if target else []
        return [ParameterDoc(renamed.get(doc.name, doc.name), doc.default, doc.meaning) for doc in documented]
    for base in node.bases:
        target = module.target_of(base.id) if isinstance(base, ast.Name) else None
        documented = parameter_docs(target, depth + 1) if target else []
        if documented:
            return documented
    return []


def _copied_constructor(node: ast.ClassDef) -> tuple[str, dict[str, str]] | None:
    """(base, {old: new}) of ``__init__ = constructor_for(__qualname__, Base.__init__, old="new")`` or of
    ``__init__ = rename_parameter(Base.__init__, "old", "new")`` in the class body."""
    for item in node.body:
        if not (isinstance(item, ast.Assign) and [ast.unparse(target) for target in item.targets] == ["__init__"]):
            continue
        call = item.value
        if not isinstance(call, ast.Call):
            continue
        helper = ast.unparse(call.func).rpartition(".")[2]
        if helper == "constructor_for" and len(call.args) == 2:
            function, names = call.args[1], [(keyword.arg, keyword.value) for keyword in call.keywords]
        elif helper == "rename_parameter" and len(call.args) == 3:
            function, names = call.args[0], [(_string(call.args[1]), call.args[2])]
        else:
            continue
        renamed = {
            old: new.value
            for old, new in names
            if old is not None and isinstance(new, ast.Constant) and isinstance(new.value, str)
        }
        if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) and len(renamed) == len(names):
            return function.value.id, renamed
    return None


def _string(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _args_section(docstring: str) -> dict[str, str]:
    """``name -> meaning`` from a Google-style ``Args:`` section (continuation lines joined)."""
    meanings: dict[str, str] = {}
    lines = docstring.splitlines()
    try:
        start = next(index for index, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:"))
    except StopIteration:
        return meanings
    indent = None
    current = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line)
        if indent is None and match:
            indent = width
        if indent is None or width < indent:
            break
        if width == indent and match:
            current = match.group(2).lstrip("*")
            meanings[current] = match.group(3).strip()
        elif current is not None:
            meanings[current] = f"{meanings[current]} {line.strip()}".strip()
    return meanings
