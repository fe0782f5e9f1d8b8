"""The approval rule language of a worker's `approval` table: what a rule may say, checked
when the configuration is read (config/declarations.py), and how one is evaluated against a
call's arguments when a step asks (steps/approval.py). See steps/approval.py for the table.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from orchestrator.errors import ConfigError

ALWAYS, NEVER = "always", "never"

_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


def check(rule: str, names: set[str] | None = None) -> None:
    """`ConfigError` if `rule` is not a rule this module can evaluate (or, with `names`,
    names an argument the tool does not take)."""
    if rule in (ALWAYS, NEVER) or is_import_path(rule):
        return
    try:
        tree = ast.parse(rule, mode="eval")
    except SyntaxError as exc:
        raise ConfigError(f"approval rule {rule!r} is not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            kind = type(node).__name__
            raise ConfigError(f"approval rule {rule!r}: {kind} is not allowed in a rule")
        if names is not None and isinstance(node, ast.Name) and node.id not in names:
            known = ", ".join(sorted(names)) or "none"
            raise ConfigError(f"approval rule {rule!r} names {node.id!r}; the tool takes {known}")


Functions = dict[str, Callable[[dict[str, Any]], Any]]  # import path -> the rule's function


def needs_person(rule: str, args: dict[str, Any], functions: Functions | None = None) -> bool:
    """Whether a call with `args` must wait for a person under `rule` (`functions`: the
    workspace's rule functions, imported by config/declarations.py)."""
    if rule == ALWAYS:
        return True
    if rule == NEVER:
        return False
    if is_import_path(rule):
        function = (functions or {}).get(rule)
        if function is None:
            raise ConfigError(f"approval rule {rule!r}: its function was not imported")
        return bool(function(dict(args)))
    try:
        return bool(_eval(ast.parse(rule, mode="eval").body, args))
    except (TypeError, KeyError, ValueError):
        return True  # a rule that cannot be evaluated on these arguments: a person decides


_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.Compare,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.List,
    ast.Tuple,
    *_COMPARE,
)


def _eval(node: ast.AST, args: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return args[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_eval(e, args) for e in node.elts]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, args)
        return (not value) if isinstance(node.op, ast.Not) else -value
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, args) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, args)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, args)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise ValueError(f"{type(node).__name__} in a rule")


def is_import_path(rule: str) -> bool:
    module, _, name = rule.partition(":")
    return bool(module) and name.isidentifier() and all(p.isidentifier() for p in module.split("."))
