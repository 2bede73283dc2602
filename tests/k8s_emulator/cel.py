"""A small evaluator for the CEL subset that CRD `x-kubernetes-validations` rules commonly use.

Supported: literals (int, double, string, bool, null, lists), `self`/`oldSelf`, field access and indexing,
`has(x.f)`, `size(x)`/`x.size()`, `x in list|map`, `startsWith`/`endsWith`/`contains`/`matches`,
`all`/`exists` macros, `int()`/`string()`/`double()`, unary `!`/`-`, `* / % + -`, comparisons, `&&`/`||` with
CEL's error-absorbing semantics, and `?:`. Anything else raises `CelUnsupported`, which the schema validator
reports as a documented gap rather than a rejection.
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+\.\d+|\d+)(?P<unsigned>u?)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%<>!?:.,()\[\]])
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
)""", re.VERBOSE)


class CelError(Exception):
    """The rule could not be evaluated on this value (a missing field, a type mismatch)."""


class CelUnsupported(Exception):
    """The rule uses CEL this evaluator does not implement."""


def _tokenize(text: str) -> list[tuple[str, Any]]:
    tokens, pos = [], 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise CelUnsupported(f"cannot tokenize {text[pos:]!r}")
        pos = match.end()
        if match.group("num") is not None:
            raw = match.group("num")
            tokens.append(("lit", float(raw) if "." in raw else int(raw)))
        elif match.group("str") is not None:
            tokens.append(("lit", bytes(match.group("str")[1:-1], "utf-8").decode("unicode_escape")))
        elif match.group("op") is not None:
            tokens.append(("op", match.group("op")))
        else:
            word = match.group("ident")
            literals = {"true": True, "false": False, "null": None}
            tokens.append(("lit", literals[word]) if word in literals else ("ident", word))
    tokens.append(("end", None))
    return tokens


_BINARY = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "in": 3,
           "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}


class _Parser:
    """Pratt parser to a tuple AST: ('lit', v), ('id', name), ('get', x, f), ('idx', x, i), ('call', f, target, args),
    ('has', x, f), ('un', op, x), ('bin', op, a, b), ('cond', c, a, b), ('list', items)."""

    def __init__(self, text: str) -> None:
        self.tokens, self.pos = _tokenize(text), 0

    def peek(self) -> tuple[str, Any]:
        return self.tokens[self.pos]

    def take(self, value: str | None = None) -> tuple[str, Any]:
        token = self.tokens[self.pos]
        if value is not None and token[1] != value:
            raise CelUnsupported(f"expected {value!r}, got {token[1]!r}")
        self.pos += 1
        return token

    def parse(self) -> tuple:
        node = self.expr()
        if self.peek()[0] != "end":
            raise CelUnsupported(f"unexpected {self.peek()[1]!r}")
        return node

    def expr(self) -> tuple:
        cond = self.binary(1)
        if self.peek() == ("op", "?"):
            self.take("?")
            then = self.expr()
            self.take(":")
            return ("cond", cond, then, self.expr())
        return cond

    def binary(self, min_prec: int) -> tuple:
        left = self.unary()
        while True:
            kind, value = self.peek()
            op = value if kind == "op" or (kind == "ident" and value == "in") else None
            if op not in _BINARY or _BINARY[op] < min_prec:
                return left
            self.take()
            left = ("bin", op, left, self.binary(_BINARY[op] + 1))

    def unary(self) -> tuple:
        if self.peek() in (("op", "!"), ("op", "-")):
            op = self.take()[1]
            return ("un", op, self.unary())
        return self.postfix(self.primary())

    def args(self) -> list[tuple]:
        self.take("(")
        items = []
        while self.peek() != ("op", ")"):
            items.append(self.expr())
            if self.peek() == ("op", ","):
                self.take(",")
        self.take(")")
        return items

    def postfix(self, node: tuple) -> tuple:
        while True:
            if self.peek() == ("op", "."):
                self.take(".")
                kind, name = self.take()
                if kind != "ident":
                    raise CelUnsupported(f"bad field {name!r}")
                node = ("call", name, node, self.args()) if self.peek() == ("op", "(") else ("get", node, name)
            elif self.peek() == ("op", "["):
                self.take("[")
                index = self.expr()
                self.take("]")
                node = ("idx", node, index)
            else:
                return node

    def primary(self) -> tuple:
        kind, value = self.take()
        if kind == "lit":
            return ("lit", value)
        if kind == "op" and value == "(":
            node = self.expr()
            self.take(")")
            return node
        if kind == "op" and value == "[":
            items = []
            while self.peek() != ("op", "]"):
                items.append(self.expr())
                if self.peek() == ("op", ","):
                    self.take(",")
            self.take("]")
            return ("list", items)
        if kind == "ident":
            if self.peek() == ("op", "("):
                if value == "has":
                    self.take("(")
                    target = self.postfix(self.primary())
                    self.take(")")
                    if target[0] != "get":
                        raise CelUnsupported("has() needs a field selection")
                    return ("has", target[1], target[2])
                return ("call", value, None, self.args())
            return ("id", value)
        raise CelUnsupported(f"unexpected {value!r}")


def _present(value: Any) -> bool:
    return value is not None


def _eval(node: tuple, env: dict[str, Any]) -> Any:
    tag = node[0]
    if tag == "lit":
        return node[1]
    if tag == "list":
        return [_eval(n, env) for n in node[1]]
    if tag == "id":
        if node[1] not in env:
            raise CelUnsupported(f"undeclared reference to {node[1]!r}")  # a compile error in real CEL
        return env[node[1]]
    if tag == "get":
        target = _eval(node[1], env)
        if not isinstance(target, dict) or not _present(target.get(node[2])):
            raise CelError(f"no such key: {node[2]}")
        return target[node[2]]
    if tag == "has":
        target = _eval(node[1], env)
        return isinstance(target, dict) and _present(target.get(node[2]))
    if tag == "idx":
        target, index = _eval(node[1], env), _eval(node[2], env)
        try:
            return target[index]
        except (KeyError, IndexError, TypeError) as err:
            raise CelError(f"index {index!r}: {err}") from None
    if tag == "un":
        value = _eval(node[2], env)
        return (not value) if node[1] == "!" else -value
    if tag == "cond":
        return _eval(node[2], env) if _eval(node[1], env) else _eval(node[3], env)
    if tag == "bin":
        return _binary(node[1], node[2], node[3], env)
    if tag == "call":
        return _call(node[1], node[2], node[3], env)
    raise CelUnsupported(tag)


def _logical(op: str, left: tuple, right: tuple, env: dict[str, Any]) -> bool:
    decisive = op == "||"  # the value that settles the result on either side
    error: CelError | None = None
    try:
        if bool(_eval(left, env)) is decisive:
            return decisive
    except CelError as err:
        error = err
    if bool(_eval(right, env)) is decisive:
        return decisive
    if error is not None:
        raise error
    return not decisive


def _binary(op: str, left: tuple, right: tuple, env: dict[str, Any]) -> Any:
    if op in ("&&", "||"):
        return _logical(op, left, right, env)
    a, b = _eval(left, env), _eval(right, env)
    try:
        if op == "in":
            return a in b
        if op == "/":
            return a // b if isinstance(a, int) and isinstance(b, int) else a / b
        if op == "%":
            return a - b * int(a / b) if isinstance(a, int) else a % b  # CEL truncates toward zero
        ops = {"==": lambda: a == b, "!=": lambda: a != b, "<": lambda: a < b, "<=": lambda: a <= b,
               ">": lambda: a > b, ">=": lambda: a >= b, "+": lambda: a + b, "-": lambda: a - b,
               "*": lambda: a * b}
        return ops[op]()
    except (TypeError, ZeroDivisionError) as err:
        raise CelError(f"{op}: {err}") from None


_FUNCTIONS = {"size", "startsWith", "endsWith", "contains", "matches", "int", "double", "string"}


def _call(name: str, target_node: tuple | None, arg_nodes: list[tuple], env: dict[str, Any]) -> Any:
    if name in ("all", "exists", "exists_one") and target_node is not None:
        collection = _eval(target_node, env)
        var = arg_nodes[0]
        if var[0] != "id":
            raise CelUnsupported("macro variable must be an identifier")
        items = collection.keys() if isinstance(collection, dict) else collection
        results = [bool(_eval(arg_nodes[1], {**env, var[1]: item})) for item in items]
        return all(results) if name == "all" else (any(results) if name == "exists" else results.count(True) == 1)
    if name not in _FUNCTIONS:
        raise CelUnsupported(f"function {name}()")
    args = [_eval(n, env) for n in arg_nodes]
    if target_node is not None:
        args.insert(0, _eval(target_node, env))
    try:
        if name == "size":
            return len(args[0])
        if name == "startsWith":
            return args[0].startswith(args[1])
        if name == "endsWith":
            return args[0].endswith(args[1])
        if name == "contains":
            return args[1] in args[0]
        if name == "matches":
            return re.search(args[1], args[0]) is not None
        if name == "int":
            return int(args[0])
        if name == "double":
            return float(args[0])
        if name == "string":
            return str(args[0]).lower() if isinstance(args[0], bool) else str(args[0])
    except (TypeError, ValueError, AttributeError) as err:
        raise CelError(f"{name}(): {err}") from None
    raise CelUnsupported(f"function {name}()")


def compile_rule(rule: str) -> tuple:
    return _Parser(rule).parse()


def evaluate(rule: str, self_value: Any, old_self: Any = None, has_old: bool = False) -> bool:
    env: dict[str, Any] = {"self": self_value}
    if has_old:
        env["oldSelf"] = old_self
    return bool(_eval(compile_rule(rule), env))
