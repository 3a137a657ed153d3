"""One owner per piece of state (issue 25): a request's KV bookkeeping has one writer.

`Request`'s invariant (request.py: `kv_slots` holds the slots of `fill[:kv_len]`, the first
`cached_len` cache-owned through `node`, ...) used to be written from four modules (state,
batch builder, output processor, constrained rows) and `jump` from three. Now only the
transitions in request.py write them. Read from the code (AST) of every production module of
the scheduler: no assignment, augmented assignment, `del` or mutating call on those fields
outside request.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNER = "scheduler_service/request.py"
FIELDS = frozenset(
    {
        "kv_slots",
        "kv_len",
        "pending",
        "cached_len",
        "node",
        "phase",
        "jump",
        "no_jump_at",
        "handle",
        "epoch",
    }
)
MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort"})
# Attributes of the same names on other types (checked by hand: not a Request).
NOT_A_REQUEST = {
    ("scheduler_service/grammar/placement.py", "p.jump"),  # MaskStepPlan.jump, a handle list
}


def _name(node: ast.expr) -> str:
    return ast.unparse(node)


def _written(target: ast.expr) -> ast.Attribute | None:
    """The `x.field` a write goes to (through subscripts: `x.kv_slots[3:] = ...`)."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Attribute) and target.attr in FIELDS:
        return target
    return None


def _writes(tree: ast.Module) -> list[ast.Attribute]:
    out: list[ast.Attribute] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            for t in node.targets:
                targets += t.elts if isinstance(t, ast.Tuple) else [t]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        out += [a for t in targets if (a := _written(t)) is not None]
    return out


def test_only_request_py_writes_the_kv_fields() -> None:
    offenders = []
    for path in sorted((ROOT / "scheduler_service").rglob("*.py")):
        mod = str(path.relative_to(ROOT))
        if mod == OWNER:
            continue
        for attr in _writes(ast.parse(path.read_text())):
            owner = attr.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                continue  # an attribute of the module's own class (a cache node, a link)
            if (mod, _name(attr)) in NOT_A_REQUEST:
                continue
            offenders.append(f"{mod}:{attr.lineno} writes {_name(attr)}")
    assert not offenders, "\n".join(offenders)


def test_the_check_sees_each_kind_of_write() -> None:
    """The checker itself: every shape of write the old code used is found."""
    old = """
r.kv_slots.append(slot)
r.kv_len += 1
del r.kv_slots[keep:]
r.node, r.cached_len = n, c
req.phase = Phase.DONE
req.jump = jumps[h]
st.running[h].pending -= 1
"""
    found = sorted(_name(a) for a in _writes(ast.parse(old)))
    assert found == [
        "r.cached_len",
        "r.kv_len",
        "r.kv_slots",
        "r.kv_slots",
        "r.node",
        "req.jump",
        "req.phase",
        "st.running[h].pending",
    ]
