"""Issue 10's corpus (tests/silent_corpus.py): every case is refused with one line naming
the op and its line in silent_corpus.py, or trains on the CS exactly as TensorFlow does.
Never validate and then diverge.

    exact                10 steps on the CS and on the CPU: same losses and weights; then
                         the CS evaluates the trained weights with TF's loss
    dropout              the CS's masks (read from its streamed dropout output) are
                         dropout's: values kept scaled by 1/keep or zeroed, shared along
                         noise_shape's 1-axes, a new mask each step, keep rate near 1-rate;
                         and TF fed the CS's dropped inputs trains the same weights
    resume               3 steps, snapshot, reload at global step 3, 3 more steps = 6 steps
    checkpoint           a CS checkpoint of a Keras-Dropout model resumes on the CPU path
    batch_norm_training  exact (the whole batch's statistics at a batch barrier)
    recurrent            exact (Keras LSTM over fixed-length sequences: unrolled), or refused
                         saying recurrent layers are not supported
"""
from __future__ import annotations

import cs_inprocess
import numpy as np
import pytest
import silent_corpus as corpus
import tensorflow as tf
import tf_reference

from common.errors import CSRunError
from coordinator.compiler import CompileResult
from launcher.estimator import CSEstimator
from tf_model import checkpoints

pytestmark = pytest.mark.slow
STEPS = 10


# The compile of each (model_fn, input_fn): the cases of one model (keras_dropout's resume,
# checkpoint and masks) differ only in params["case"], which no model reads.
COMPILED: dict[tuple, CompileResult] = {}


def compile_or_refusal(case: corpus.Case, params: dict, model_dir: str, refusal_must_say: str = ""):
    """The compile result, or None after checking the refusal names an op and its line."""
    key = (case.model_fn, case.input_fn)
    try:
        if key not in COMPILED:
            COMPILED[key] = cs_inprocess.compile_checked(case.model_fn, case.input_fn, params, model_dir)
        return COMPILED[key]
    except CSRunError as error:
        words = cs_inprocess.model_op_words(case.model_fn, case.input_fn, params)
        problem = cs_inprocess.refusal_problem(error, corpus.__file__, words)
        assert not problem, problem
        assert refusal_must_say.lower() in str(error).lower(), (
            f"the refusal does not say {refusal_must_say!r}: {error}")
        return None


def check_exact(case, params, model_dir, refusal_must_say=""):
    compiled = compile_or_refusal(case, params, model_dir, refusal_must_say)
    if compiled is None:
        return
    data = tf_reference.batches(case.input_fn, params, STEPS)
    cs = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data)
    reference = tf_reference.run(case.model_fn, case.input_fn, params, compiled.initial_weights, data)
    trained = cs_inprocess.Comparison(compiled, cs, reference)
    cs_inprocess.assert_same_training(trained)
    problem = cs_inprocess.evaluation_mismatch(case.model_fn, case.input_fn, params, model_dir, trained)
    assert not problem, problem


def dropped_output(compiled, run: cs_inprocess.CSRun) -> list[np.ndarray]:
    """Per step, the dropout's output the model hands to its host_call."""
    inputs = {s.name for s in compiled.program.inputs}
    names = [n for n in compiled.program.outputs if n not in inputs]
    assert len(names) == 1, f"expected the dropped features among the outputs, got {names}"
    return [step[names[0]] for step in run.outputs]


def check_dropout(case, params, model_dir):
    compiled = compile_or_refusal(case, params, model_dir)
    if compiled is None:
        return
    data = tf_reference.batches(case.input_fn, params, STEPS)
    cs = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data, with_outputs=True)
    dropped = dropped_output(compiled, cs)
    keep = 1.0 - corpus.DROPOUT_RATE
    masks = []
    for (x, _), d in zip(data, dropped):
        kept = d != 0
        np.testing.assert_allclose(d[kept], x[kept] / np.float32(keep), rtol=1e-6,
                                   err_msg="kept values are not scaled by 1/keep")
        shared = kept.all(axis=case.shared_axes) if case.shared_axes else kept
        if case.shared_axes:
            assert np.array_equal(shared, kept.any(axis=case.shared_axes)), (
                f"the mask is not shared along axes {case.shared_axes} (noise_shape)")
        masks.append(shared)
    assert not all(np.array_equal(masks[0], m) for m in masks[1:]), "every step has the same mask"
    units = np.concatenate([m.ravel() for m in masks])
    sigma = np.sqrt(keep * (1 - keep) / units.size)
    assert abs(units.mean() - keep) < 5 * sigma, f"kept {units.mean():.3f}, expected {keep}"
    # What TF trains given the CS's masks: the model without dropout on the dropped inputs.
    fed = [(d, y) for d, (_, y) in zip(dropped, data)]
    reference = tf_reference.run(case.reference, case.input_fn, params, compiled.initial_weights, fed)
    cs_inprocess.assert_same_training(cs_inprocess.Comparison(compiled, cs, reference))


def check_resume(case, params, model_dir):
    compiled = compile_or_refusal(case, params, model_dir)
    if compiled is None:
        return
    data = tf_reference.batches(case.input_fn, params, 6)
    program, initial = compiled.program, compiled.initial_weights
    unbroken = cs_inprocess.run_on_cs(program, initial, data, with_outputs=True)
    first = cs_inprocess.run_on_cs(program, initial, data[:3], with_outputs=True)
    resumed = cs_inprocess.run_on_cs(program, first.state, data[3:], global_step=3, first_batch=3,
                                     with_outputs=True)
    after = dropped_output(compiled, resumed)
    before = dropped_output(compiled, unbroken)
    assert not np.array_equal(after[0] != 0, dropped_output(compiled, first)[0] != 0), (
        "the resumed run replays step 1's dropout mask")
    for step, (a, b) in enumerate(zip(after, before[3:]), start=4):
        np.testing.assert_array_equal(a != 0, b != 0, err_msg=f"step {step}'s mask after a resume")
    assert unbroken.losses[3:] == resumed.losses
    for name, value in unbroken.state.items():
        np.testing.assert_array_equal(resumed.state[name], value, err_msg=name)


def check_checkpoint(case, params, model_dir):
    compiled = compile_or_refusal(case, params, model_dir)
    if compiled is None:
        return
    data = tf_reference.batches(case.input_fn, params, 3)
    cs = cs_inprocess.run_on_cs(compiled.program, compiled.initial_weights, data)
    # What the chief writes after a CS run: the snapshot and the global step.
    checkpoints.write_checkpoint(model_dir, 3, {**cs.state, "global_step": np.asarray(3, np.int64)},
                                 keep_max=None)
    CSEstimator(case.model_fn, model_dir=model_dir, params=params).train(
        case.input_fn, steps=1, use_cs=False)
    step4 = checkpoints.read_checkpoint(checkpoints.checkpoint_path(model_dir, 4))
    assert int(step4["global_step"]) == 4  # the CPU path resumed the CS's checkpoint


CHECKS = {"exact": check_exact, "dropout": check_dropout, "resume": check_resume,
          "checkpoint": check_checkpoint,
          "recurrent": lambda c, p, d: check_exact(c, p, d, "recurrent")}


@pytest.mark.parametrize("name", sorted(corpus.CASES))
def test_corpus_case_is_refused_naming_the_op_or_trains_like_tensorflow(name, tmp_path):
    case = corpus.CASES[name]
    CHECKS[case.check](case, corpus.params_for(name), str(tmp_path))
    tf.keras.backend.clear_session()
