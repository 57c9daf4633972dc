"""Schedules: optimizer hyper-parameters the graph computes from the global step, lowered to
the scalar programs of wafer.schedules.

    lower_schedules(extracted, scheduled, writes) -> tuple[Schedule, ...]

What is lowered is the graph TensorFlow executes, not the graph model_fn built: one training
step runs in a throw-away Session that reports its partition graph (after Grappler, which
rewrites a division by a constant into a multiplication by its reciprocal, folds constants
and converts Pow by a constant; and after If ops became Switch/Merge). Its nodes upstream of
each hyper-parameter become scalar ops, so the CS computes, op by op, what TF computes. The
leaves may be constants, the global step, and float32 scalar variables that are not
trainable and that nothing in the train_op writes (loaded with the job's state); anything
else is refused naming the op and its source line.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from coordinator.compiler.extract import ExtractedGraph, data_upstream, op_closure, user_name, user_source
from coordinator.compiler.scalar_ops import BINARY, BOOL_RESULTS, DTYPES, UNARY
from wafer.schedules import ARITY, ScalarOp, Schedule, schedule_problem

SUPPORTED = ("tf.compat.v1.train.exponential_decay, piecewise_constant, polynomial_decay, "
             "cosine_decay, cosine_decay_restarts, inverse_time_decay, natural_exp_decay, "
             "warmups with tf.where / tf.cond / tf.minimum")


class ScheduleRefused(Exception):
    """One problem, as the line the user reads (the op and its source line included)."""


@dataclass(frozen=True)
class Scheduled:
    """A hyper-parameter the graph computes: the update op reading it, and the tensor."""

    key: str  # the schedule's hyper_parameter
    apply: tf.Operation
    tensor: tf.Tensor
    label: str = ""  # what the user reads ("" : the optimizer's `key`)
    name: str = ""  # identifies the schedule ("": key); updates of one name share it
    before_increment: bool = True  # read before the step's increment (an optimizer update)

    @property
    def what(self) -> str:
        return self.label or f"the {self.key} of the optimizer"


def _refuse(op: tf.Operation, what: str) -> ScheduleRefused:
    return ScheduleRefused(f"{what} ({op.type} '{user_name(op)}' at {user_source(op)})")


def _check_leaves(extracted: ExtractedGraph, item: Scheduled, written: set[str]) -> set[str]:
    """The variables item's tensor reads (the global step excepted), each allowed."""
    graph = extracted.graph
    step = global_step(graph)
    with graph.as_default():
        trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
    variables = set()
    for op in data_upstream(item.tensor.op):
        if op.type == "Placeholder":
            raise _refuse(item.apply, f"{item.what} is computed from the "
                                      f"model's input {op.name}; the CS computes hyper-parameters "
                                      "from the global step and constants only")
        if op.type not in ("VarHandleOp", "VariableV2") or op.name == step:
            continue
        dtype = tf.as_dtype(op.get_attr("dtype")).base_dtype
        shape = tf.TensorShape(op.get_attr("shape"))
        why = ("the train_op writes it" if op.name in written else
               "it is trainable" if op.name in trainable else
               f"it is {dtype.name}, not float32" if dtype != tf.float32 else
               f"it is not a scalar ({shape})" if shape.rank != 0 else "")
        if why:
            raise _refuse(op, f"{item.what} reads the variable {op.name}: "
                              f"{why}; a schedule may read the global step, constants and "
                              "float32 scalar variables nothing trains or writes")
        variables.add(op.name)
    return variables


def global_step(graph: tf.Graph) -> str:
    steps = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    return steps[0].op.name if steps else ""


def check_increment(extracted: ExtractedGraph, items: list[Scheduled]) -> None:
    """TF reads the global step before the step's increment only if the increment waits for
    every update that reads a schedule."""
    step = global_step(extracted.graph)
    train = extracted.spec.train_op
    train_op = train.op if isinstance(train, tf.Tensor) else train
    for op in op_closure(train_op):
        if op.type in ("AssignAddVariableOp", "AssignAdd") and op.inputs and \
                _handle_name(op.inputs[0].op) == step:
            before = set(op_closure(op))
            for item in items:
                reads = [r for r in data_upstream(item.tensor.op) if r.type in _READS
                         and r.inputs and _handle_name(r.inputs[0].op) == step]
                after = [r for r in reads if op in set(op_closure(r))]
                if item.before_increment and not after and (
                        item.apply in before or reads and all(r in before for r in reads)):
                    continue  # (the increment waits for the update reading it, or the reads)
                if not item.before_increment and len(after) == len(reads):
                    continue
                raise _refuse(op, f"the global step's increment and {item.what} (read by "
                                  f"'{item.apply.name}') do not wait for each other: TF may "
                                  "read the step before or after the increment")


_READS = ("ReadVariableOp", "Identity")
_LIVENESS = {"Switch", "Merge", "Const", "HostConst", "Assert", "NoOp", "Cast", "Select",
             "SelectV2"}


def _handle_name(op: tf.Operation) -> str:
    while op.type in ("Identity", "ReadVariableOp") and op.inputs:
        op = op.inputs[0].op
    return op.name


def executed_graph(extracted: ExtractedGraph):
    """The GraphDef TensorFlow executes for one step of extracted's mode on input_fn's first
    batch (zeros outside training: the values do not change what runs): training's fetches
    are the CPU path's, the train_op and the loss; evaluation's the loss; prediction's the
    predictions."""
    graph, spec = extracted.graph, extracted.spec
    batch = extracted.first_batch or {}
    feed = {}
    for s in extracted.inputs:
        placeholder = graph.get_tensor_by_name(extracted.placeholders[s.name])
        feed[placeholder] = batch[s.name] if s.name in batch else \
            np.zeros(placeholder.shape, placeholder.dtype.as_numpy_dtype)
    fetches = [f for f in (spec.train_op, spec.loss) if f is not None] or spec.predictions
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(init)
        session.run(fetches, feed, options=tf.compat.v1.RunOptions(output_partition_graphs=True),
                    run_metadata=metadata)
    nodes = {}
    for partition in metadata.partition_graphs:
        nodes.update({n.name: n for n in partition.node})
    return nodes


class _Lowering:
    """The executed nodes upstream of one hyper-parameter, as scalar ops."""

    def __init__(self, graph: tf.Graph, nodes: dict, item: Scheduled, step: str,
                 variables: set[str]):
        self.graph, self.nodes, self.item, self.step = graph, nodes, item, step
        self.variables = variables
        self.ops: list[ScalarOp] = []
        self.index: dict[tuple[str, int], int] = {}

    def user_op(self, name: str) -> tf.Operation:
        """The op of the user's graph an executed node comes from (its name, or the
        nearest enclosing name: a cond's branches are inlined under the cond's name)."""
        parts = name.split("/")
        while parts:
            try:
                return self.graph.get_operation_by_name("/".join(parts))
            except KeyError:
                parts.pop()
        return self.item.apply

    def refuse(self, node, what: str) -> ScheduleRefused:
        op = self.user_op(node.name)
        return _refuse(op, f"{self.item.what} is computed per step by "
                           f"{node.op} '{node.name}': {what}")

    def add(self, op: ScalarOp) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def lower(self, ref: str) -> int:
        """The index of the scalar op computing `ref` ("node" or "node:port")."""
        name, _, port_text = ref.partition(":")
        port = int(port_text or 0)
        key = (name, port)
        if key not in self.index:
            node = self.nodes.get(name)
            if node is None:
                raise _refuse(self.item.apply, f"{self.item.what} reads "
                                               f"{ref}, which TensorFlow does not execute")
            self.index[key] = self._node(node, port)
        return self.index[key]

    def _controls(self, node) -> tuple[int, ...]:
        """The control inputs a node's deadness depends on: those of the scalar program (a
        cond's pivots, asserts); others (the optimizer's updates, the step's increment: never
        in a cond of the schedule) only order it."""
        names = [i[1:] for i in node.input if i.startswith("^")]
        return tuple(self.lower(name) for name in names if name in self.nodes and (
            self.nodes[name].op in _LIVENESS or self.nodes[name].op in UNARY
            or self.nodes[name].op in BINARY))

    def _node(self, node, port: int) -> int:
        data = [i for i in node.input if not i.startswith("^")]
        controls = self._controls(node)
        t = node.op
        attr = node.attr
        if t in ("Const", "HostConst"):
            value = tf.make_ndarray(attr["value"].tensor)
            dtype = self._dtype(node, tf.as_dtype(attr["dtype"].type))
            if value.size != 1:
                raise self.refuse(node, f"a constant of shape {value.shape}; schedules are scalar")
            return self.add(ScalarOp("const", dtype, (), controls,
                                     float(value.reshape(())), ""))
        if t in ("ReadVariableOp", "VariableV2", "Identity") and self._variable(node) is not None:
            name = self._variable(node)
            controls += self._handle_liveness(node)
            if name == self.step:
                return self.add(ScalarOp("step", "int64", (), controls))
            if name not in self.variables:
                raise self.refuse(node, f"it reads the variable {name}")
            return self.add(ScalarOp("variable", "float32", (), controls, name=name))
        if t == "Cast":
            source = self.lower(data[0])
            return self.add(ScalarOp("cast", self._dtype(node, tf.as_dtype(attr["DstT"].type)),
                                     (source,), controls))
        if t == "Switch":
            inputs: tuple[int, ...] = (self.lower(data[0]), self.lower(data[1]))
            return self.add(ScalarOp("switch_true" if port == 1 else "switch_false",
                                     self.ops[inputs[0]].dtype, inputs, controls))
        if t == "Merge":
            if port != 0:
                raise self.refuse(node, "a cond's branch index")
            inputs = tuple(self.lower(i) for i in data)
            return self.add(ScalarOp("merge", self.ops[inputs[0]].dtype, inputs, controls))
        if t == "Assert":
            condition = self.lower(data[0])
            return self.add(ScalarOp("assert", "bool", (condition,), controls,
                                     name=self.user_op(node.name).name))
        if t == "NoOp":
            return self.add(ScalarOp("const", "bool", (), controls, 1.0))
        if t == "Sum":
            return self._sum(node, data, controls)
        if t in ("Select", "SelectV2"):
            inputs = tuple(self.lower(i) for i in data)
            return self.add(ScalarOp("select", self.ops[inputs[1]].dtype, inputs, controls))
        kind = UNARY.get(t) or BINARY.get(t)
        if kind is None:
            raise self.refuse(node, f"the CS evaluates {SUPPORTED} (the ops "
                                    f"{', '.join(sorted({*UNARY, *BINARY}))}, casts and "
                                    "conditionals of scalars)")
        inputs = tuple(self.lower(i) for i in data)
        if len(inputs) != ARITY[kind]:
            raise self.refuse(node, f"{len(inputs)} inputs")
        dtype = "bool" if kind in BOOL_RESULTS else self.ops[inputs[0]].dtype
        return self.add(ScalarOp(kind, dtype, inputs, controls))

    def _sum(self, node, data, controls) -> int:
        """Sum of a Pack of integer scalars (piecewise_constant's check that one interval
        holds the step), as additions."""
        source = self.nodes.get(data[0].partition(":")[0])
        cast = None
        if source is not None and source.op == "Cast":
            cast = tf.as_dtype(source.attr["DstT"].type)
            source = self.nodes.get(source.input[0].partition(":")[0])
        dtype = tf.as_dtype(node.attr["T"].type)
        if source is None or source.op != "Pack" or not dtype.is_integer:
            raise self.refuse(node, "a reduction; schedules are scalar")
        total = None
        for element in (i for i in source.input if not i.startswith("^")):
            index = self.lower(element)
            if cast is not None:
                index = self.add(ScalarOp("cast", self._dtype(node, cast), (index,)))
            total = index if total is None else self.add(
                ScalarOp("add", self.ops[index].dtype, (total, index)))
        assert total is not None
        return self.add(ScalarOp("identity", self.ops[total].dtype, (total,), controls))

    def _handle_path(self, node) -> list:
        """The nodes from a read back to its variable (a cond's branch passes the resource
        handle through Identity and Switch nodes)."""
        path = [node]
        while path[-1].op in ("ReadVariableOp", "Identity", "Switch") and path[-1].input:
            source = self.nodes.get(path[-1].input[0].partition(":")[0].lstrip("^"))
            if source is None:
                break
            path.append(source)
        return path

    def _variable(self, node) -> str | None:
        """The variable a read (or a ref variable) stands for, else None."""
        last = self._handle_path(node)[-1]
        return last.name if last.op in ("VarHandleOp", "VariableV2") else None

    def _handle_liveness(self, node) -> tuple[int, ...]:
        """The liveness a read inherits from its handle's path: the path's control inputs
        and, for each Switch, whether the handle takes that port."""
        controls: list[int] = []
        path = self._handle_path(node)
        for current, source_ref in zip(path[1:], [n.input[0] for n in path[:-1]]):
            controls += [self.lower(i[1:]) for i in current.input if i.startswith("^")]
            if current.op == "Switch":
                port = int(source_ref.partition(":")[2] or 0)
                anchor = self.add(ScalarOp("const", "bool", (), (), 1.0))
                controls.append(self.add(ScalarOp(
                    "switch_true" if port == 1 else "switch_false", "bool",
                    (anchor, self.lower(current.input[1])))))
        return tuple(controls)

    def _dtype(self, node, dtype: tf.DType) -> str:
        if dtype.base_dtype not in DTYPES:
            raise self.refuse(node, f"it computes in {dtype.name}; schedules compute in "
                                    "float32, int64, int32 and bool")
        return DTYPES[dtype.base_dtype]


def lower_schedules(extracted: ExtractedGraph, items: list[Scheduled],
                    written: set[str]) -> dict[str, Schedule]:
    """The schedule of each scheduled hyper-parameter by name (updates of one name read the
    same tensor), or ScheduleRefused."""
    if not items:
        return {}
    variables = set()
    for item in items:
        variables |= _check_leaves(extracted, item, written)
    check_increment(extracted, items)
    nodes = executed_graph(extracted)
    schedules: dict[str, Schedule] = {}
    for item in items:
        schedule = lower_value(extracted, nodes, item, variables)
        known = schedules.setdefault(item.name or item.key, schedule)
        if known.ops != schedule.ops:
            raise _refuse(item.apply, f"the {item.key} of '{item.apply.name}' is computed "
                                      f"differently from that of other updates of the same "
                                      "optimizer settings; the CS trains optimizers of equal "
                                      "settings as one, with one schedule of each")
    return schedules


def lower_value(extracted: ExtractedGraph, nodes: dict, item: Scheduled,
                variables: set[str]) -> Schedule:
    """The schedule of one value the graph computes per step, from the `nodes` TensorFlow
    executes (executed_graph; a node rewritten away: what its reader reads), or
    ScheduleRefused."""
    lowering = _Lowering(extracted.graph, nodes, item, global_step(extracted.graph), variables)
    ref = item.tensor.name.removesuffix(":0")
    if ref.partition(":")[0] not in nodes:  # rewritten away: what the update reads
        apply = nodes.get(item.apply.name)
        if apply is None:
            raise _refuse(item.apply, f"{item.what}: TensorFlow does not execute "
                                      f"'{item.apply.name}' as built")
        index = list(item.apply.inputs).index(item.tensor)
        ref = apply.input[index]
        others = {t.op.name for j, t in enumerate(item.apply.inputs) if j != index}
        if item.apply.type == "Mul" and ref.partition(":")[0] in others:  # commuted
            ref = apply.input[1 - index]
    lowering.lower(ref)
    return _checked(lowering, item)


def lower_predicate(extracted: ExtractedGraph, nodes: dict, item: Scheduled,
                    negated: bool = False) -> Schedule:
    """The program of a bool the graph computes per step from the global step and constants
    (a tf.cond's predicate; its negation when `negated`) as float32 1 or 0, from the `nodes`
    TensorFlow executes (executed_graph), or ScheduleRefused."""
    lowering = _Lowering(extracted.graph, nodes, item, global_step(extracted.graph), set())
    value = lowering.lower(item.tensor.name.removesuffix(":0"))
    if negated:
        value = lowering.add(ScalarOp("logical_not", "bool", (value,)))
    lowering.add(ScalarOp("cast", "float32", (value,)))
    return _checked(lowering, item)


def _checked(lowering: _Lowering, item: Scheduled) -> Schedule:
    """The lowered ops as item's schedule, or ScheduleRefused saying why the CS cannot run it."""
    schedule = Schedule(item.key, tuple(lowering.ops), item.tensor.name,
                        user_source(item.tensor.op))
    problem = schedule_problem(schedule)
    if problem:
        raise _refuse(item.tensor.op, f"{item.what} cannot run on the CS: {problem}")
    return schedule
