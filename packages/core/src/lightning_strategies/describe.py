"""Parameter documentation of a strategy class, read from its source without importing it.

`lightning-strategies info` must not import a backend, yet users want each default with its
meaning. The class's source is parsed: ``__init__``'s defaults, and the Google-style ``Args:``
section of the class or ``__init__`` docstring.
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


def parameter_docs(target: str) -> list[ParameterDoc]:
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
            return _class_parameters(node)
    return []


def _class_parameters(node: ast.ClassDef) -> list[ParameterDoc]:
    init = next((item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__"), None)
    if init is None:
        return []
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
