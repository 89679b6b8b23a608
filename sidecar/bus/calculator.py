"""A safe arithmetic evaluator: parse with ``ast``, walk a whitelist, never ``eval``.

Bounded in every dimension a hostile expression could use: source length, node count, integer size
and exponent size. Anything outside the whitelist is a ``CalcError`` naming what was refused.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Final

__all__ = ["CalcError", "evaluate"]

MAX_SOURCE: Final = 1000
"""Characters in one expression."""
MAX_NODES: Final = 200
"""AST nodes in one expression."""
MAX_INT_BITS: Final = 4096
"""Largest integer an intermediate result may be (bits); bigger ones are refused, not computed."""

Number = int | float

_BINARY: Final[dict[type[ast.operator], Callable[[Number, Number], Number]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: Final[dict[type[ast.unaryop], Callable[[Number], Number]]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: Final[dict[str, Callable[..., Number]]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": math.factorial,
}
_CONSTANTS: Final[dict[str, float]] = {"pi": math.pi, "e": math.e, "tau": math.tau}


class CalcError(ValueError):
    """The expression is not allowed or cannot be computed."""


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, a few math functions."""
    if len(expression) > MAX_SOURCE:
        raise CalcError(f"expression longer than {MAX_SOURCE} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an arithmetic expression: {exc.msg}") from None
    try:
        return _eval(tree.body, [MAX_NODES])
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except OverflowError:
        raise CalcError("result too large") from None
    except (ValueError, TypeError) as exc:
        if isinstance(exc, CalcError):
            raise
        raise CalcError(f"math error: {exc}") from None


def _eval(node: ast.expr, budget: list[int]) -> Number:
    # Counted as it is walked (a walk of its own first cost as much as the parse): each node visited
    # takes one from the budget, so a huge expression is refused before much of it is computed.
    budget[0] -= 1
    if budget[0] < 0:
        raise CalcError(f"expression has more than {MAX_NODES} parts")
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalcError(f"only numbers are allowed, not {type(node.value).__name__}")
        return _bounded(node.value)
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, budget), _eval(node.right, budget)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        binary = _BINARY.get(type(node.op))
        if binary is None:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed")
        return _bounded(binary(left, right))
    if isinstance(node, ast.UnaryOp):
        unary = _UNARY.get(type(node.op))
        if unary is None:
            raise CalcError(f"operator {type(node.op).__name__} is not allowed")
        return unary(_eval(node.operand, budget))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalcError(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call):
        return _call(node, budget)
    raise CalcError(f"{type(node).__name__} is not allowed in an expression")


def _call(node: ast.Call, budget: list[int]) -> Number:
    if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
        raise CalcError("only these functions are allowed: " + ", ".join(sorted(_FUNCTIONS)))
    if node.keywords:
        raise CalcError("keyword arguments are not allowed")
    args = [_eval(arg, budget) for arg in node.args]
    if node.func.id == "factorial" and (len(args) != 1 or not isinstance(args[0], int) or args[0] > 500):
        raise CalcError("factorial takes one integer up to 500")
    value: Number = _FUNCTIONS[node.func.id](*args)
    return _bounded(value)


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        # SECURITY: refuse before computing; 9**9**9 would otherwise pin a core for minutes.
        if base not in (0, 1, -1) and exponent * max(abs(base).bit_length(), 1) > MAX_INT_BITS:
            raise CalcError("result too large")
        power: Number = base**exponent
        return power
    result = math.pow(base, exponent)
    return _bounded(result)


def _bounded(value: Number) -> Number:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise CalcError("result too large")
    if isinstance(value, float) and math.isnan(value):
        raise CalcError("result is not a number")
    return value
