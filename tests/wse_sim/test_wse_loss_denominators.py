"""A loss divided by a count of the batch on the CS (wafer.kernels.losses.BatchLoss with
denominators): the batch's count comes from the whole batch before it streams through, so
micro-batches of any size and any number of stages give the same numbers; a batch whose
weights are all 0 has loss 0 and SGD leaves the weights; Load refuses a denominator
computed from weights."""
from __future__ import annotations

import numpy as np
import pytest

from cs_api import cs_api_pb2 as pb
from cs_api.attrs import to_attr
from wafer.kernels.losses import DIVISOR, divisors_attr, sum_name
from wafer.schedules import ScalarOp, Schedule
from wse_sim.errors import CSError
from wse_sim.pipeline import Pipeline
from wse_sim.program import check_program, check_state

FEATURES, BATCH, CLASSES = 6, 16, 3
REGION = pb.Region(x=0, y=0, width=2, height=2)
TABLE = np.array([0.0, 1.0, 2.5], np.float32)


def program(micro: int, divisor_source: str = "present") -> pb.Program:
    """features -> dense -> sparse cross-entropy, weighted by per-sample weights, summed
    and divided by the count of nonzero weights (DivNoNan), counted by two kernels ahead."""
    p = pb.Program(name="weighted", fabric="cs1", batch_size=BATCH, micro_batch_size=micro,
                   loss_kernel="loss", seed=3, optimizer=pb.Optimizer(type="sgd", learning_rate=0.5))
    p.inputs.add(name="features", dtype=pb.FLOAT32, shape=[FEATURES])
    p.inputs.add(name="labels", dtype=pb.INT32, shape=[])
    p.inputs.add(name="weights", dtype=pb.FLOAT32, shape=[])  # class weights by label
    dense = p.kernels.add(name="logits", type="dense", inputs=["features"], output_shape=[CLASSES],
                          region=REGION)
    dense.attrs["units"].i, dense.attrs["use_bias"].b, dense.attrs["activation"].s = CLASSES, True, "linear"
    for role, shape in (("kernel", [FEATURES, CLASSES]), ("bias", [CLASSES])):
        dense.params.add(role=role, variable=f"logits/{role}", shape=shape, dtype=pb.FLOAT32)
    present = p.kernels.add(name="present", type="binary", inputs=["weights"], output_shape=[],
                            region=REGION)
    present.attrs["op"].s, present.attrs["operands"].s = "not_equal", "ic"
    present.attrs["c1"].CopyFrom(to_attr(np.asarray(0.0, np.float32)))
    cast = p.kernels.add(name="count", type="cast", inputs=["present"], output_shape=[], region=REGION)
    cast.attrs["dtype"].s = "float32"
    xent = p.kernels.add(name="xent", type="softmax_cross_entropy_with_logits",
                         inputs=["logits", "labels"], output_shape=[], region=REGION)
    xent.attrs["sparse"].b = True
    weighted = p.kernels.add(name="weighted", type="binary", inputs=["xent", "weights"],
                             output_shape=[], region=REGION)
    weighted.attrs["op"].s, weighted.attrs["operands"].s = "mul", "ii"
    loss = p.kernels.add(name="loss", type="loss", inputs=["weighted", divisor_source.replace(
        "present", "count")], output_shape=[], region=REGION)
    loss.attrs["scale"].f = 1.0
    count = Schedule(DIVISOR, (ScalarOp("input", "float32", name=sum_name(0)),))
    for key, value in (("divided_by", [0]), ("divisors", divisors_attr([count])),
                       ("div_no_nan", [1])):
        loss.attrs[key].CopyFrom(to_attr(value))
    return p


def batches(labels_of_batch_1=None):
    rng = np.random.default_rng(4)
    out = []
    for k in range(3):
        labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
        if k == 1 and labels_of_batch_1 is not None:
            labels[:] = labels_of_batch_1
        out.append({"features": rng.normal(size=(BATCH, FEATURES)).astype(np.float32),
                    "labels": labels, "weights": TABLE[labels]})
    return out


def train(p: pb.Program, data, stages: int = 1):
    rng = np.random.default_rng(5)
    weights = {"logits/kernel": rng.normal(size=(FEATURES, CLASSES)).astype(np.float32),
               "logits/bias": np.zeros(CLASSES, np.float32)}
    checked = check_program(p)
    pipeline = Pipeline.load(checked, check_state(checked, weights), threads=stages, min_stage_flops=0)
    try:
        states, losses = [], []
        for step, batch in enumerate(data):
            losses.append(pipeline.run(batch, training=True, step=step).loss)
            states.append(np.array(pipeline.state()["logits/kernel"]))
        return losses, states, weights
    finally:
        pipeline.close()


def test_the_count_is_the_whole_batchs_for_any_micro_batch_and_stages():
    data = batches()
    whole, _, weights = train(program(BATCH), data)
    logits = data[0]["features"] @ weights["logits/kernel"]
    shifted = logits - logits.max(1, keepdims=True)
    xent = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(BATCH), data[0]["labels"]]
    w = data[0]["weights"]
    assert whole[0] == pytest.approx((w * xent).sum() / np.count_nonzero(w), rel=1e-6)
    for micro, stages in ((4, 1), (2, 2)):
        losses, _, _ = train(program(micro), data, stages)
        np.testing.assert_allclose(losses, whole, rtol=1e-6)


def test_a_batch_of_zero_weights_has_loss_0_and_sgd_stands_still():
    losses, states, _ = train(program(4), batches(labels_of_batch_1=0))
    assert losses[1] == 0.0 and losses[0] > 0 and losses[2] > 0
    np.testing.assert_array_equal(states[1], states[0])
    assert not np.array_equal(states[2], states[1])


def test_load_refuses_a_denominator_computed_from_weights():
    with pytest.raises(CSError) as info:
        check_program(program(4, divisor_source="xent"))
    assert "kernel 'logits' computes a denominator of the loss from weights" in str(info.value)


def test_load_refuses_a_divisor_reading_a_sum_the_loss_does_not_have():
    p = program(4)
    loss = next(k for k in p.kernels if k.name == "loss")
    reads_s1 = Schedule(DIVISOR, (ScalarOp("input", "float32", name=sum_name(1)),))
    loss.attrs["divisors"].CopyFrom(to_attr(divisors_attr([reads_s1])))
    with pytest.raises(CSError) as info:
        check_program(p)
    assert "'loss' (loss)" in str(info.value) and "(divisor 0: reads an unknown sum)" in str(info.value)
