"""docs/design.md states every constant of the fabric, timing, placement and CS API models
with the value the code has: a changed constant fails here until the page says so."""
import ast
import dataclasses
import math
import re
from pathlib import Path

import pytest

from wafer.fabric import FABRICS, Fabric

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design.md"
# The modules whose named numbers the design page explains.
MODULES = ("wafer/timing.py", "wafer/kernels/base.py", "coordinator/compiler/placement.py",
           "coordinator/compiler/program.py", "coordinator/compiler/loss_tail.py",
           "coordinator/compiler/training/numbers.py",
           "coordinator/compiler/training/noise.py", "cs_api/__init__.py", "cs_api/tensors.py",
           "cs_api/shared_input.py",
           "coordinator/compiler/recurrences.py", "coordinator/compiler/rounding_spread.py",
           "cs_api/liveness.py", "cs_api/client.py",
           "wse_sim/limits.py",
           "wse_sim/cs_system.py", "wse_sim/server.py", "wse_sim/pipeline.py",
           "workers/feed.py", "coordinator/starvation.py")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


def numbers(text: str) -> list[float]:
    return [float(n.rstrip(",").replace(",", "")) for n in NUMBER.findall(text)]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


@dataclasses.dataclass(frozen=True)
class Constant:
    module: str
    name: str
    value: object  # a number, or a dict of numbers
    source: str  # the expression as written in the module


def _evaluate(node: ast.expr, known: dict[str, object]) -> object:
    """A literal arithmetic expression (numbers, + - * / << **, names of earlier constants,
    dicts of those); anything else raises ValueError."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, known), _evaluate(node.right, known)
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
               ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
               ast.LShift: lambda a, b: a << b, ast.Pow: lambda a, b: a ** b}
        if type(node.op) in ops:
            return ops[type(node.op)](left, right)
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {k.value: _evaluate(v, known) for k, v in zip(node.keys, node.values)}
    raise ValueError("not a number")


def constants() -> list[Constant]:
    found = []
    for module in MODULES:
        text = (ROOT / module).read_text()
        known: dict[str, object] = {}
        for statement in ast.parse(text).body:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target, value = statement.targets[0], statement.value
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                target, value = statement.target, statement.value
            else:
                continue
            if not isinstance(target, ast.Name) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", target.id):
                continue
            try:
                known[target.id] = _evaluate(value, known)
            except ValueError:
                continue
            if known[target.id] == {}:  # a registry filled at import, not a number
                continue
            found.append(Constant(module, target.id, known[target.id],
                                  ast.get_source_segment(text, value)))
    return found


def mentions(name: str, width: int) -> list[str]:
    """The page's text right after each mention of `name` (lines joined: a wrapped sentence
    reads as one)."""
    text = " ".join(DOC.read_text().split())
    tag = f"`{name}`"
    return [text[m.end():m.end() + width] for m in re.finditer(re.escape(tag), text)]


def test_the_scan_finds_the_models_constants():
    names = {c.name for c in constants()}
    assert {"MIN_FLOPS_PER_CORE", "BYTES_PER_VALUE", "OPTIMIZER_SLOTS", "SLICE_BUDGET",
            "MAX_BATCH_BYTES", "MAX_MESSAGE_BYTES", "LEASE_BEAT_S", "KEEPALIVE_S"} <= names


@pytest.mark.parametrize("constant", constants(), ids=lambda c: c.name)
def test_every_constant_is_on_the_design_page_with_its_value(constant):
    """Named in backticks, its value (or the code's expression) right after the name."""
    after = mentions(constant.name, 200 if isinstance(constant.value, dict) else 60)
    assert after, f"docs/design.md does not name `{constant.name}` ({constant.module})"
    if isinstance(constant.value, dict):
        for key, value in constant.value.items():
            pattern = re.compile(rf"\b{re.escape(str(key))}\s+({NUMBER.pattern})")
            assert any(close(float(m.group(1).rstrip(",").replace(",", "")), value)
                       for text in after for m in pattern.finditer(text)), (
                f"docs/design.md gives `{constant.name}` without '{key} {value}' "
                f"({constant.module} has {constant.source})")
        return
    stated = any(constant.source in text or any(close(n, constant.value) for n in numbers(text))
                 for text in after)
    assert stated, (f"docs/design.md gives `{constant.name}` without its value "
                    f"{constant.value} ({constant.module}: {constant.source})")


def fabric_rows() -> dict[str, list[str]]:
    """The fabric table's rows: the field names of the first cell -> the cells after it."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        fields = re.findall(r"`(\w+)`", cells[0]) if line.startswith("|") else []
        if fields and all(f in {f.name for f in dataclasses.fields(Fabric)} for f in fields):
            rows[" ".join(fields)] = cells[1:]
    return rows


def test_the_fabric_table_has_every_field_of_every_fabric():
    header = next(line for line in DOC.read_text().splitlines()
                  if line.startswith("| field |"))
    assert re.findall(r"`(\w+)`", header) == list(FABRICS), \
        "the fabric table's columns are not the fabrics of wafer/fabric.py, in order"
    rows = fabric_rows()
    listed = {name for key in rows for name in key.split()}
    missing = {f.name for f in dataclasses.fields(Fabric)} - listed - {"name"}
    assert not missing, f"the fabric table has no row for {sorted(missing)}"
    for key, cells in rows.items():
        fields = key.split()
        for column, fabric in enumerate(FABRICS.values()):
            expected = [getattr(fabric, f) for f in fields]
            stated = numbers(cells[column])[:len(fields)]
            assert len(stated) == len(expected) and all(map(close, stated, expected)), (
                f"the fabric table gives {' x '.join(fields)} of {fabric.name} as "
                f"{cells[column]!r}; wafer/fabric.py has {expected}")


def fc_mnist_rate(fabric: str) -> float:
    """FC-MNIST's compute-bound training rate as the compiler places it (SGD, batch 256)."""
    from coordinator.compiler.placement import place
    from wafer.kernels import build_kernel

    kernels = [build_kernel("dense", "d1", {"units": 500, "activation": "relu"}, [(784,)]),
               build_kernel("dense", "d2", {"units": 300, "activation": "relu"}, [(500,)]),
               build_kernel("dense", "d3", {"units": 10}, [(300,)]),
               build_kernel("softmax_cross_entropy_with_logits", "xent", {"sparse": True},
                            [(10,), ()]),
               build_kernel("loss", "loss", {"scale": 1 / 256}, [()])]
    edges = [("features", "d1"), ("d1", "d2"), ("d2", "d3"), ("d3", "xent"),
             ("labels", "xent"), ("xent", "loss")]
    placement = place(kernels, FABRICS[fabric], training=True, inputs={"features": 784 * 4, "labels": 4}, edges=edges)
    return placement.timing.compute_samples_per_sec


def test_min_flops_per_core_is_calibrated_to_the_published_cs2_estimate_and_the_page_says_so():
    from wafer.kernels.base import MIN_FLOPS_PER_CORE

    cs2 = FABRICS["cs2"]
    rate = fc_mnist_rate("cs2")
    # every kernel at its parallelism limit: r f eta / (3 x MIN_FLOPS_PER_CORE) ~ 1.27 M
    assert rate == pytest.approx(cs2.core_flops_per_sec / (3 * MIN_FLOPS_PER_CORE), rel=1e-3)
    assert rate == pytest.approx(1.27e6, rel=5e-3)
    text = DOC.read_text()
    for fabric in FABRICS:
        assert f"{fc_mnist_rate(fabric):,.0f}" in text, \
            f"docs/design.md's FC-MNIST table does not give the {fabric} rate the code computes"
