"""The part of CEL the rules' conditions use, evaluated in Python where the answer is certain.

Loading the CEL binding is a large part of a short command's start (the extension module
imports `logging` for pyo3-log and `datetime`, and logging alone pulls in threading,
traceback and string formatting), while the conditions in rules/*.yaml are small: names,
'strings', numbers, true/false, ! && || == != < <= > >=, parentheses, size(x), x.size() and
x.startsWith('...').

compile() parses such a condition into a tree, or returns None for anything else (the rule
keeps its CEL program).  evaluate() answers only where the operands have one of the plain
types and their meaning is plain: bools for ! && ||, two values of the same type (int, float,
str, bool) for == != < <= > >=, a list or string for size(), a string for startsWith.  For
everything else (a missing name, null, an int against a float, a non-bool operand of &&) it
raises Defer, and the caller asks the real CEL, so the binding's own semantics (errors,
cross-type rules) decide those cases.  tests/unit/test_judge_cel_subset.py compares the two on
every condition of rules/ over generated contexts.
"""
from __future__ import annotations

import re


class Defer(Exception):
    """Not answered here: ask the CEL binding."""


_TOKEN = re.compile(r"\s*(?:(?P<num>\d+\.\d+|\d+)|(?P<str>'[^'\\]*')|(?P<name>[A-Za-z_]\w*)"
                    r"|(?P<op>&&|\|\||==|!=|<=|>=|[<>!().,]))")
_RELATIONS = ("==", "!=", "<", "<=", ">", ">=")


def compile(text: str):
    """The condition's tree, or None when it is not in the subset."""
    tokens = []
    pos, end = 0, len(text.rstrip())
    while pos < end:
        match = _TOKEN.match(text, pos)
        if match is None:
            return None
        pos = match.end()
        kind = match.lastgroup
        value = match.group(kind)
        if kind == "num":
            value = float(value) if "." in value else int(value)
        elif kind == "str":
            value = value[1:-1]
        tokens.append((kind, value))
    parser = _Parser(tokens)
    try:
        tree = parser.or_expr()
    except _NotSubset:
        return None
    return tree if parser.at == len(tokens) else None


class _NotSubset(Exception):
    pass


class _Parser:
    """Recursive descent in CEL's precedence: || below &&, below the relations, below !,
    below member calls."""

    def __init__(self, tokens: list):
        self.tokens, self.at = tokens, 0

    def peek(self):
        return self.tokens[self.at] if self.at < len(self.tokens) else (None, None)

    def take(self, value=None):
        kind, got = self.peek()
        if kind is None or (value is not None and (kind != "op" or got != value)):
            raise _NotSubset
        self.at += 1
        return kind, got

    def or_expr(self):
        return self._chain("||", self.and_expr)

    def and_expr(self):
        return self._chain("&&", self.relation)

    def _chain(self, op: str, operand):
        """operand (op operand)*, left-associative."""
        left = operand()
        while self.peek() == ("op", op):
            self.take()
            left = (op, left, operand())
        return left

    def relation(self):
        left = self.unary()
        kind, op = self.peek()
        if kind == "op" and op in _RELATIONS:
            self.take()
            right = self.unary()
            if self.peek()[0] == "op" and self.peek()[1] in _RELATIONS:
                raise _NotSubset  # a == b == c: not written in the rules, left to CEL
            return (op, left, right)
        return left

    def unary(self):
        if self.peek() == ("op", "!"):
            self.take()
            return ("!", self.unary())
        return self.member()

    def member(self):
        node = self.primary()
        while self.peek() == ("op", "."):
            self.take()
            kind, method = self.take()
            if kind != "name" or method not in ("size", "startsWith"):
                raise _NotSubset
            self.take("(")
            if method == "size":
                self.take(")")
                node = ("size", node)
            else:
                kind, prefix = self.take()
                if kind != "str":
                    raise _NotSubset
                self.take(")")
                node = ("startsWith", node, prefix)
        return node

    def primary(self):
        kind, value = self.take()
        if kind == "op" and value == "(":
            node = self.or_expr()
            self.take(")")
            return node
        if kind in ("num", "str"):
            return ("lit", value)
        if kind == "name":
            if value in ("true", "false"):
                return ("lit", value == "true")
            if value == "null":
                raise _NotSubset
            if self.peek() == ("op", "("):
                if value != "size":
                    raise _NotSubset
                self.take("(")
                node = self.or_expr()
                self.take(")")
                return ("size", node)
            return ("name", value)
        raise _NotSubset


_PLAIN = (bool, int, float, str)
_INT64 = 1 << 63


def evaluate(tree, context: dict) -> bool:
    """The condition's value over ``context`` (a bool), or Defer."""
    value = _eval(tree, context)
    if value.__class__ is not bool:
        raise Defer  # a condition that is not a bool: CEL's answer
    return value


def _eval(node, context: dict):
    op = node[0]
    if op == "name":
        try:
            value = context[node[1]]
        except KeyError:
            raise Defer from None  # CEL: no such variable (an error the engine reads as no match)
        if value.__class__ is int and not -_INT64 <= value < _INT64:
            raise Defer  # past CEL's int64: the binding's conversion decides
        if value.__class__ in _PLAIN or value.__class__ in (list, tuple):
            return value
        raise Defer
    if op == "lit":
        return node[1]
    if op == "!":
        value = _eval(node[1], context)
        if value.__class__ is not bool:
            raise Defer
        return not value
    if op == "&&" or op == "||":
        left = _eval(node[1], context)
        if left.__class__ is not bool:
            raise Defer
        if left is (op == "||"):
            return left  # false && x, true || x: CEL gives this whatever x is, error or not
        right = _eval(node[2], context)
        if right.__class__ is not bool:
            raise Defer
        return right
    if op == "size":
        value = _eval(node[1], context)
        if value.__class__ in (list, tuple) or (value.__class__ is str and value.isascii()):
            return len(value)
        raise Defer  # the binding counts a string's UTF-8 bytes, not its code points: its answer
    if op == "startsWith":
        value = _eval(node[1], context)
        if value.__class__ is not str:
            raise Defer
        return value.startswith(node[2])
    left, right = _eval(node[1], context), _eval(node[2], context)
    if left.__class__ is not right.__class__ or left.__class__ not in _PLAIN:
        raise Defer  # another type on each side (1 == 1.0, true == 1): CEL's rules
    if left.__class__ is bool and op not in ("==", "!="):
        raise Defer
    if left.__class__ is float and (left != left or right != right):
        raise Defer  # NaN
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right
    if op == "<=":
        return left <= right
    if op == ">":
        return left > right
    return left >= right
