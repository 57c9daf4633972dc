"""Match kernels: group the ops that carry samples from the inputs to the loss into the
library kernels of wse_sim.kernels, and list every op that fits none."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import tensorflow as tf

from launcher.compiler.extract import ExtractedGraph, data_flow_ops, user_source
from launcher.compiler.ir import KernelNode, MatchedModel, ParamRef, UnsupportedOp
from launcher.compiler.training import analyze_training
from launcher.errors import CSRunError
from launcher.estimator_spec import ModeKeys

ACTIVATIONS = {"Relu": "relu", "Relu6": "relu6", "LeakyRelu": "leaky_relu", "Elu": "elu",
               "Selu": "selu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softplus": "softplus"}
# Fused into a dense or conv2d kernel (leaky_relu keeps its own kernel for its alpha).
FUSABLE_ACTIVATIONS = {k: v for k, v in ACTIVATIONS.items() if k != "LeakyRelu"}
ALIAS_OPS = {"Identity", "StopGradient", "Snapshot", "Cast", "PreventGradient"}
VARIABLE_OPS = {"VarHandleOp", "VariableV2", "Variable"}
# Between a variable and its use: reads and shape changes that keep its values.
VARIABLE_VIEW_OPS = {"ReadVariableOp", "Identity", "Cast", "Reshape", "Squeeze", "ExpandDims"}
# Host-side tails of predict-mode outputs: computed by the chief from streamed values.
HOST_OPS = {"Softmax", "ArgMax", "ArgMin", "Cast", "Identity", "Squeeze", "ExpandDims",
            "Reshape", "Sigmoid", "Round", "Greater", "GreaterEqual", "Less", "LogSoftmax"}
LOSS_REDUCTION_OPS = {"Mul", "Sum", "Mean", "DivNoNan", "RealDiv", "Div", "Cast", "Identity",
                      "Reshape", "Squeeze", "Neg"}
SUPPORTED_KERNELS = (
    "dense (MatMul [+ BiasAdd/Add] [+ activation]; tf.keras.layers.Dense, tf.matmul)",
    "conv2d (Conv2D NHWC, SAME/VALID, strides [+ bias] [+ activation])",
    "max_pool, avg_pool (MaxPool, AvgPool)",
    "activation (relu, relu6, leaky_relu, elu, selu, tanh, sigmoid, softplus, linear)",
    "dropout (tf.nn.dropout, tf.keras.layers.Dropout)",
    "reshape (tf.reshape, Flatten, squeeze, expand_dims)",
    "add (x + y of two activations)", "concat (tf.concat off the batch axis)",
    "sparse_softmax_cross_entropy, softmax_cross_entropy, sigmoid_cross_entropy, "
    "mean_squared_error (tf.compat.v1.losses.* or tf.nn.* with reduce_mean/reduce_sum)",
)


def per_sample(tensor: tf.Tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape.as_list()[1:])


def const_value(tensor: tf.Tensor, flow: set) -> np.ndarray | None:
    if tensor.op in flow:
        return None
    value = tf.get_static_value(tensor)
    return None if value is None else np.asarray(value)


def variable_of(tensor: tf.Tensor, flow: set) -> tuple[str, tuple[int, ...]] | None:
    """(variable name, variable shape) if `tensor` is a read (or reshaped read) of one."""
    op = tensor.op
    while op not in flow and op.type in VARIABLE_VIEW_OPS and op.inputs:
        op = op.inputs[0].op
    if op in flow or op.type not in VARIABLE_OPS:
        return None
    shape = op.get_attr("shape") if op.type == "VarHandleOp" else op.outputs[0].shape
    return op.name, tuple(int(d) for d in tf.TensorShape(shape).as_list())


class _Matcher:
    """One pass over the data-flow ops, in graph order."""

    def __init__(self, extracted: ExtractedGraph, targets: list[tf.Tensor],
                 host_tensors: list[tf.Tensor]):
        self.x = extracted
        graph = extracted.graph
        sources = [graph.get_tensor_by_name(s.tf_tensor) for s in extracted.inputs]
        ops = data_flow_ops(graph, sources, targets)
        ops = self._drop_host_tails(ops, targets)
        self.ops = ops
        self.flow = set(ops)
        self.values: dict[str, str] = {}  # tensor name -> kernel/input name
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.internal: dict[str, str] = {}  # tensors inside a kernel -> kernel
        self.consumed: set[tf.Operation] = set()
        self.kernels: list[KernelNode] = []
        self.unsupported: list[UnsupportedOp] = []
        self.loss_kernel = ""
        self.one_hot: dict[str, tf.Tensor] = {}  # one-hot labels -> the integer labels
        self.protected = self._host_read_tensors(host_tensors)
        for spec in extracted.inputs:
            self.values[spec.tf_tensor] = spec.name

    # ---- graph queries ----
    def _drop_host_tails(self, ops: list[tf.Operation], targets: list[tf.Tensor]):
        if self.x.mode != ModeKeys.PREDICT:
            return ops
        keep = list(ops)
        changed = True
        while changed:
            changed = False
            alive = set(keep)
            for op in reversed(keep):
                users = [c for out in op.outputs for c in out.consumers() if c in alive]
                if op.type in HOST_OPS and not users:
                    keep.remove(op)
                    changed = True
                    break
        return keep

    def _host_read_tensors(self, host_tensors: list[tf.Tensor]) -> set[str]:
        """Data-flow tensors read by host-side computations (metrics, predictions)."""
        upstream, stack = set(), [t.op for t in host_tensors]
        while stack:
            op = stack.pop()
            if op in upstream or op in self.flow:
                continue
            upstream.add(op)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
        read = {t.name for t in host_tensors if t.op in self.flow}
        for op in upstream:
            read.update(t.name for t in op.inputs if t.op in self.flow)
        return read

    def consumers(self, tensor: tf.Tensor) -> list[tf.Operation]:
        return [c for c in tensor.consumers() if c in self.flow]

    def sole_consumer(self, tensor: tf.Tensor) -> tf.Operation | None:
        users = self.consumers(tensor)
        if len(users) != 1 or tensor.name in self.protected or users[0] in self.consumed:
            return None
        return users[0]

    def value(self, tensor: tf.Tensor) -> str | None:
        return self.values.get(tensor.name)

    def unique_name(self, base: str) -> str:
        taken = {k.name for k in self.kernels} | {s.name for s in self.x.inputs}
        name, i = base, 1
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        return name

    # ---- recording ----
    def add_kernel(self, base: str, type_: str, inputs: list[tf.Tensor], attrs: dict[str, Any],
                   params: list[ParamRef], ops: list[tf.Operation], output: tf.Tensor,
                   output_shape: tuple[int, ...] | None = None) -> KernelNode:
        name = self.unique_name(base)
        kernel = KernelNode(
            name=name, type=type_, inputs=tuple(self.values[t.name] for t in inputs),
            input_shapes=tuple(self.shapes.get(t.name, per_sample(t)) for t in inputs),
            attrs=attrs, params=tuple(params),
            output_shape=per_sample(output) if output_shape is None else output_shape,
            tf_tensor=output.name, source=user_source(ops[0]), ops=tuple(op.name for op in ops))
        self.kernels.append(kernel)
        self.consumed.update(ops)
        for op in ops:
            for out in op.outputs:
                self.internal.setdefault(out.name, name)
        self.values[output.name] = name
        self.shapes[output.name] = kernel.output_shape
        return kernel

    def reject(self, op: tf.Operation, reason: str = "") -> None:
        self.unsupported.append(UnsupportedOp(op.type, op.name, user_source(op), reason))
        self.consumed.add(op)
        for out in op.outputs:  # keep going so that every unsupported op is found
            self.values[out.name] = op.name
            self.shapes[out.name] = per_sample(out) if out.shape.rank else ()

    # ---- the pass ----
    def run(self) -> None:
        matchers: list[Callable[[tf.Operation], bool]] = [
            self.match_alias, self.match_one_hot, self.match_loss, self.match_dense, self.match_conv2d,
            self.match_pool, self.match_dropout, self.match_activation, self.match_reshape,
            self.match_add, self.match_concat]
        for op in self.ops:
            if op in self.consumed or op.type == "Placeholder" and op.outputs[0].name in self.values:
                continue
            if any(m(op) for m in matchers):
                continue
            self.reject(op)

    def data_inputs(self, op: tf.Operation) -> list[tf.Tensor]:
        return [t for t in op.inputs if t.op in self.flow]

    def _is_alias(self, op: tf.Operation) -> bool:
        """Ops that pass their input on unchanged (a reshape to the same shape included)."""
        if op.type in ALIAS_OPS:
            return bool(op.inputs)
        return (op.type in ("Reshape", "Squeeze", "ExpandDims") and op.outputs[0].shape.rank
                is not None and op.outputs[0].shape == op.inputs[0].shape)

    def match_alias(self, op: tf.Operation) -> bool:
        if not self._is_alias(op):
            return False
        if op.inputs[0].name in self.one_hot:
            self.one_hot[op.outputs[0].name] = self.one_hot[op.inputs[0].name]
            self.consumed.add(op)
            return True
        if self.value(op.inputs[0]) is None:
            return False
        self.values[op.outputs[0].name] = self.value(op.inputs[0])
        self.shapes[op.outputs[0].name] = self.shapes.get(op.inputs[0].name,
                                                          per_sample(op.inputs[0]))
        self.consumed.add(op)
        return True

    def match_one_hot(self, op: tf.Operation) -> bool:
        """tf.one_hot(labels, k) feeding a softmax cross-entropy: a sparse one, on the labels."""
        if op.type != "OneHot" or not self._is_labels(op.inputs[0]):
            return False
        on, off = const_value(op.inputs[2], self.flow), const_value(op.inputs[3], self.flow)
        if on is None or off is None or float(on) != 1.0 or float(off) != 0.0:
            return False
        self.one_hot[op.outputs[0].name] = op.inputs[0]
        self.consumed.add(op)
        return True

    def _bias_and_activation(self, out: tf.Tensor, channels: int, ops: list[tf.Operation],
                             params: list[ParamRef]) -> tuple[tf.Tensor, str]:
        nxt = self.sole_consumer(out)
        if nxt is not None and nxt.type in ("BiasAdd", "Add", "AddV2"):
            other = [t for t in nxt.inputs if t is not out]
            bias = variable_of(other[0], self.flow) if len(other) == 1 else None
            if bias is not None and int(np.prod(bias[1])) == channels:
                params.append(ParamRef("bias", bias[0], (channels,)))
                ops.append(nxt)
                out = nxt.outputs[0]
        activation = "linear"
        nxt = self.sole_consumer(out)
        if nxt is not None and nxt.type in FUSABLE_ACTIVATIONS:
            activation = FUSABLE_ACTIVATIONS[nxt.type]
            ops.append(nxt)
            out = nxt.outputs[0]
        return out, activation

    @staticmethod
    def _scope(op: tf.Operation, variable: str = "") -> str:
        """A kernel's base name: its variable's scope, else its op's scope, else the op."""
        if "/" in variable:
            return variable.rsplit("/", 1)[0]
        return op.name.rsplit("/", 1)[0] if "/" in op.name else op.name

    def match_dense(self, op: tf.Operation) -> bool:
        if op.type != "MatMul":
            return False
        x, w = op.inputs
        var = variable_of(w, self.flow)
        if var is None or self.value(x) is None or x.shape.rank != 2:
            return False
        if op.get_attr("transpose_a") or op.get_attr("transpose_b"):
            self.reject(op, "transposed MatMul: store the weight as (inputs, units)")
            return True
        units = int(w.shape[1])
        params = [ParamRef("kernel", var[0], var[1])]
        ops = [op]
        out, activation = self._bias_and_activation(op.outputs[0], units, ops, params)
        self.add_kernel(self._scope(op, var[0]), "dense", [x],
                        {"units": units, "use_bias": len(params) == 2, "activation": activation},
                        params, ops, out)
        return True

    def match_conv2d(self, op: tf.Operation) -> bool:
        if op.type != "Conv2D":
            return False
        x, w = op.inputs
        var = variable_of(w, self.flow)
        if var is None or self.value(x) is None:
            return False
        padding = op.get_attr("padding").decode()
        strides = list(op.get_attr("strides"))
        dilations = list(op.get_attr("dilations"))
        if op.get_attr("data_format").decode() != "NHWC" or padding not in ("SAME", "VALID"):
            self.reject(op, "conv2d needs NHWC data and SAME or VALID padding")
            return True
        if dilations != [1, 1, 1, 1] or strides[0] != 1 or strides[3] != 1:
            self.reject(op, "dilated convolutions are not supported")
            return True
        kh, kw, _, filters = var[1]
        params = [ParamRef("kernel", var[0], var[1])]
        ops = [op]
        out, activation = self._bias_and_activation(op.outputs[0], filters, ops, params)
        self.add_kernel(self._scope(op, var[0]), "conv2d", [x], {
            "filters": int(filters), "kernel_size": [int(kh), int(kw)],
            "strides": [int(strides[1]), int(strides[2])], "padding": padding,
            "use_bias": len(params) == 2, "activation": activation}, params, ops, out)
        return True

    def match_pool(self, op: tf.Operation) -> bool:
        if op.type not in ("MaxPool", "AvgPool") or self.value(op.inputs[0]) is None:
            return False
        ksize, strides = list(op.get_attr("ksize")), list(op.get_attr("strides"))
        if (op.get_attr("data_format").decode() != "NHWC" or ksize[0] != 1 or ksize[3] != 1
                or strides[0] != 1 or strides[3] != 1):
            self.reject(op, "pooling must be NHWC over height and width only")
            return True
        self.add_kernel(self._scope(op),
                        "max_pool" if op.type == "MaxPool" else "avg_pool", [op.inputs[0]], {
                            "pool_size": [int(ksize[1]), int(ksize[2])],
                            "strides": [int(strides[1]), int(strides[2])],
                            "padding": op.get_attr("padding").decode()}, [], [op], op.outputs[0])
        return True

    def match_dropout(self, op: tf.Operation) -> bool:
        """x * (1 / keep) masked by uniform >= rate (tf.nn.dropout, Keras Dropout)."""
        if op.type != "Mul":
            return False
        data = self.data_inputs(op)
        if len(data) != 1 or self.value(data[0]) is None:
            return False
        scale = const_value([t for t in op.inputs if t is not data[0]][0], self.flow)
        select = self.sole_consumer(op.outputs[0])
        if scale is None or scale.size != 1 or select is None or select.type not in (
                "SelectV2", "Select"):
            return False
        cond = select.inputs[0]
        if cond.op in self.flow or cond.op.type != "GreaterEqual" or select.inputs[1] is not op.outputs[0]:
            return False
        rate = const_value(cond.op.inputs[1], self.flow)
        zero = const_value(select.inputs[2], self.flow)
        if rate is None or zero is None or np.any(zero != 0):
            return False
        rate = float(rate)
        if not np.isclose(float(scale), 1.0 / (1.0 - rate), rtol=1e-4):
            return False
        self.add_kernel(self._scope(op), "dropout",
                        [data[0]], {"rate": rate}, [], [op, select], select.outputs[0])
        return True

    def match_activation(self, op: tf.Operation) -> bool:
        if op.type not in ACTIVATIONS or self.value(op.inputs[0]) is None:
            return False
        attrs: dict[str, Any] = {"function": ACTIVATIONS[op.type]}
        if op.type == "LeakyRelu":
            attrs["alpha"] = float(op.get_attr("alpha"))
        self.add_kernel(op.name, "activation", [op.inputs[0]], attrs, [], [op], op.outputs[0])
        return True

    def match_reshape(self, op: tf.Operation) -> bool:
        if op.type not in ("Reshape", "Squeeze", "ExpandDims") or self.value(op.inputs[0]) is None:
            return False
        out = op.outputs[0]
        if out.shape.rank is None or out.shape.rank == 0 or out.shape[0] != self.x.batch_size:
            self.reject(op, "reshape must keep the batch dimension first")
            return True
        self.add_kernel(self._scope(op), "reshape", [op.inputs[0]], {"shape": list(per_sample(out))},
                        [], [op], out)
        return True

    def match_add(self, op: tf.Operation) -> bool:
        if op.type not in ("Add", "AddV2", "AddN"):
            return False
        inputs = list(op.inputs)
        if any(t.op not in self.flow for t in inputs):
            self.reject(op, "adds a constant or variable outside a dense/conv2d bias")
            return True
        if any(self.value(t) is None for t in inputs):
            return False
        shapes = {per_sample(t) for t in inputs}
        if len(shapes) != 1:
            self.reject(op, f"add of different shapes {sorted(shapes)} (broadcasting)")
            return True
        self.add_kernel(self._scope(op), "add", inputs, {}, [], [op], op.outputs[0])
        return True

    def match_concat(self, op: tf.Operation) -> bool:
        if op.type != "ConcatV2":
            return False
        inputs, axis_t = list(op.inputs[:-1]), op.inputs[-1]
        axis = const_value(axis_t, self.flow)
        if axis is None or any(self.value(t) is None for t in inputs):
            return False
        rank = op.outputs[0].shape.rank
        full = int(axis) % rank
        if full == 0:
            self.reject(op, "concat along the batch axis")
            return True
        self.add_kernel(self._scope(op), "concat", inputs, {"axis": full - 1}, [], [op], op.outputs[0])
        return True

    # ---- losses ----
    def match_loss(self, op: tf.Operation) -> bool:
        found = self._loss_anchor(op)
        if found is None:
            return False
        type_, logits, labels, group = found
        if self.x.spec.loss is None:
            return False
        if self.loss_kernel:
            self.reject(op, f"a second loss; the program already has {self.loss_kernel}")
            return True
        if labels.op not in self.flow or self.value(labels) is None:
            self.reject(op, "the loss's labels must come from input_fn")
            return True
        per_sample_loss = group[-1].outputs[0]
        tail = self._descendants(per_sample_loss)
        reduction = self._reduction(per_sample_loss)
        if reduction is None:
            self.reject(op, "the loss must be the sum or the mean of the per-sample losses")
            self.consumed.update(group + tail)
            return True
        kernel = self.add_kernel(type_, type_, [logits, labels], {"reduction": reduction}, [],
                                 group + tail, self.x.spec.loss, output_shape=())
        self.loss_kernel = kernel.name
        return True

    def _loss_anchor(self, op: tf.Operation):
        if op.type in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"):
            logits, labels = op.inputs[0], op.inputs[1]
            kind = ("sparse_softmax_cross_entropy" if op.type.startswith("Sparse")
                    else "softmax_cross_entropy")
            if labels.name in self.one_hot:
                kind, labels = "sparse_softmax_cross_entropy", self.one_hot[labels.name]
            return kind, logits, labels, [op]
        if op.type == "SquaredDifference":
            return self._prediction_and_label("mean_squared_error", op.inputs, [op])
        if op.type == "Sub":
            square = self.sole_consumer(op.outputs[0])
            if square is not None and square.type == "Square":
                return self._prediction_and_label("mean_squared_error", op.inputs, [op, square])
        return self._sigmoid_cross_entropy(op)

    def _prediction_and_label(self, kind: str, inputs, group):
        a, b = inputs
        if self._is_labels(a) and not self._is_labels(b):
            a, b = b, a
        if not self._is_labels(b):
            return None
        return kind, a, b, group

    def _is_labels(self, tensor: tf.Tensor) -> bool:
        return self.value(tensor) == "labels"

    def _sigmoid_cross_entropy(self, op: tf.Operation):
        """relu(x) - x * z + log1p(exp(-|x|)) under one name scope (tf.nn's logistic_loss)."""
        scope = op.name.rsplit("/", 1)[0] if "/" in op.name else None
        if scope is None:
            return None
        try:
            head = op.graph.get_operation_by_name(scope)
        except KeyError:
            return None
        if head not in self.flow or head.type not in ("Add", "AddV2") or not any(
                t.op.type == "Log1p" and t.op.name.startswith(scope + "/") for t in head.inputs):
            return None
        group = [o for o in self.ops if o.name.startswith(scope + "/")] + [head]
        outside = {t.name: t for o in group for t in o.inputs
                   if t.op in self.flow and t.op not in group}
        labels = [t for t in outside.values() if self._is_labels(t)]
        logits = [t for t in outside.values() if not self._is_labels(t)]
        if len(labels) != 1 or len(logits) != 1:
            return None
        return "sigmoid_cross_entropy", logits[0], labels[0], group

    def _descendants(self, tensor: tf.Tensor) -> list[tf.Operation]:
        seen, stack = [], list(self.consumers(tensor))
        while stack:
            op = stack.pop()
            if op in seen:
                continue
            seen.append(op)
            stack.extend(c for out in op.outputs for c in self.consumers(out))
        return [op for op in self.ops if op in seen]

    def _reduction(self, per_sample_loss: tf.Tensor) -> str | None:
        """mean or sum: what the user's graph does to the per-element losses, measured."""
        loss = self.x.spec.loss
        tail = self._descendants(per_sample_loss)
        if any(op.type not in LOSS_REDUCTION_OPS for op in tail):
            return None
        if not tail and loss is not per_sample_loss:
            return None
        values = np.random.default_rng(0).uniform(0.5, 2.0, per_sample_loss.shape.as_list())
        try:
            with tf.compat.v1.Session(graph=self.x.graph) as session:
                got = float(session.run(loss, {per_sample_loss: values.astype(np.float32)}))
        except tf.errors.OpError:
            return None
        for name, expected in (("mean", values.mean()), ("sum", values.sum())):
            if np.isclose(got, expected, rtol=1e-5):
                return name
        return None

    # ---- host outputs ----
    def host_outputs(self, host_tensors: Iterable[tf.Tensor]) -> tuple[str, ...]:
        """Kernels and inputs whose values the host needs to compute `host_tensors`."""
        found: list[str] = []
        seen, queue = set(), list(host_tensors)
        while queue:
            tensor = queue.pop(0)
            if tensor.name in seen:
                continue
            seen.add(tensor.name)
            if tensor.name in self.values:
                name = self.values[tensor.name]
                if name not in found:
                    found.append(name)
                continue
            if tensor.name in self.internal:
                raise CSRunError(
                    f"host-side metrics or predictions read {tensor.name}, a value inside "
                    f"kernel {self.internal[tensor.name]}",
                    "compute metrics from a layer's output (e.g. the logits)")
            queue.extend(tensor.op.inputs)
        return tuple(found)


def host_tensors(extracted: ExtractedGraph) -> list[tf.Tensor]:
    """Tensors the chief computes on the host: host_call inputs, metrics, predictions."""
    spec = extracted.spec
    tensors: list[Any] = []
    if spec.host_call is not None:
        args = spec.host_call[1]
        tensors.extend(args.values() if isinstance(args, dict) else args)
    if spec.eval_metric_ops:
        for value, update in spec.eval_metric_ops.values():
            tensors.extend([value, update])
    if extracted.mode == ModeKeys.PREDICT and spec.predictions is not None:
        preds = spec.predictions
        tensors.extend(preds.values() if isinstance(preds, dict) else [preds])
    out = []
    for t in tensors:
        if isinstance(t, tf.Operation):
            out.extend(t.inputs)
            out.extend(i for c in t.control_inputs for i in c.inputs)
        elif isinstance(t, tf.Tensor):
            out.append(t)
    return out


def match(extracted: ExtractedGraph) -> MatchedModel:
    """Group the user's ops into library kernels; unsupported ops are listed, not raised."""
    spec = extracted.spec
    hosts = host_tensors(extracted)
    if extracted.mode == ModeKeys.PREDICT:
        targets = list(hosts)
    else:
        targets = [spec.loss]
    matcher = _Matcher(extracted, targets, hosts)
    matcher.run()
    if extracted.mode != ModeKeys.PREDICT and not matcher.loss_kernel and not matcher.unsupported:
        raise CSRunError(f"no supported loss found computing {spec.loss.name}",
                         "use a tf.compat.v1.losses or tf.nn cross-entropy / squared error loss "
                         "reduced with a sum or a mean")
    training = analyze_training(extracted) if extracted.mode == ModeKeys.TRAIN else None
    outputs = matcher.host_outputs(hosts) if not matcher.unsupported else ()
    return MatchedModel(inputs=extracted.inputs, kernels=tuple(matcher.kernels),
                        loss_kernel=matcher.loss_kernel, outputs=outputs, training=training,
                        unsupported=tuple(matcher.unsupported))


def unsupported_detail(model: MatchedModel) -> str:
    """The lines listing every unsupported op, and what the library supports."""
    lines = [f"Unsupported operations ({len(model.unsupported)}):"]
    lines += [f"  {op.line()}" for op in model.unsupported]
    lines.append("Supported kernels:")
    lines += [f"  {k}" for k in SUPPORTED_KERNELS]
    return "\n".join(lines)


def check_supported(model: MatchedModel) -> None:
    if model.unsupported:
        first = model.unsupported[0]
        more = len(model.unsupported) - 1
        raise CSRunError(
            f"validation failed: {len(model.unsupported)} unsupported operation"
            f"{'s' if more else ''} in the model, first {first.type} '{first.name}' at "
            f"{first.source}",
            "replace the listed ops with supported kernels (see the list above)",
            detail=unsupported_detail(model))
