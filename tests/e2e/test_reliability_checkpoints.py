"""The reliability suite, model_dir: a damaged or missing index never restarts from scratch
over checkpoints, a damaged newest checkpoint falls back to the intact one before it, one
writer per model_dir (the second refused naming the first), leftovers of killed writers
cleaned, an optimizer change on resume handled the same on the CPU and the CS path."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.errors import CSRunError
from coordinator.chief import cs_state
from cs_api import pb
from tf_model import checkpoints
from tf_model.model_dir_lock import LOCK_FILE, model_dir_locked

WEIGHTS = {"dense/kernel": np.ones((2, 3), np.float32), "dense/bias": np.zeros(3, np.float32)}


def _write(model_dir: Path, *steps: int) -> None:
    for step in steps:
        checkpoints.write_checkpoint(str(model_dir), step, {
            **{k: v * step for k, v in WEIGHTS.items()}, "global_step": np.asarray(step, np.int64)}, 5)


def _step(model_dir: Path) -> int | None:
    latest = checkpoints.latest_checkpoint(str(model_dir))
    return None if latest is None else checkpoints.checkpoint_step(latest)


@pytest.mark.parametrize("index", ["garbage", "missing", "empty", "names_a_deleted_one"])
def test_a_damaged_or_missing_index_is_rebuilt_from_the_files(index, tmp_path, capsys):
    _write(tmp_path, 10, 20)
    path = tmp_path / "checkpoint"
    if index == "garbage":
        path.write_bytes(os.urandom(64))
    elif index == "missing":
        path.unlink()
    elif index == "empty":
        path.write_text("")
    else:
        path.write_text('model_checkpoint_path: "model.ckpt-99"\n')
    assert _step(tmp_path) == 20
    assert "rebuilt from the checkpoint files (model.ckpt-10, model.ckpt-20)" in capsys.readouterr().out
    assert checkpoints.all_checkpoints(str(tmp_path))[-1].endswith("model.ckpt-20")  # the index is whole again
    _write(tmp_path, 30)  # training on keeps both older ones
    assert [checkpoints.checkpoint_step(p) for p in checkpoints.all_checkpoints(str(tmp_path))] == [10, 20, 30]


@pytest.mark.parametrize("how", ["truncate", "flip", "empty_index"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(how, tmp_path, capsys):
    _write(tmp_path, 10, 20)
    newest = tmp_path / "model.ckpt-20.data-00000-of-00001"
    raw = bytearray(newest.read_bytes())
    if how == "truncate":
        newest.write_bytes(raw[:len(raw) // 2])
    elif how == "flip":
        raw[len(raw) // 2] ^= 0xFF
        newest.write_bytes(bytes(raw))
    else:
        (tmp_path / "model.ckpt-20.index").write_bytes(b"")
    assert _step(tmp_path) == 10
    assert "model.ckpt-20 is damaged" in capsys.readouterr().out
    tensors = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(str(tmp_path)))
    np.testing.assert_array_equal(tensors["dense/kernel"], WEIGHTS["dense/kernel"] * 10)


def test_a_training_run_sets_a_damaged_checkpoint_aside_so_rotation_keeps_the_intact_one(tmp_path, capsys):
    _write(tmp_path, 10, 20)
    (tmp_path / "model.ckpt-20.data-00000-of-00001").write_bytes(b"x")
    assert _step(tmp_path) == 10 and (tmp_path / "model.ckpt-20.index").exists()  # reading moves nothing
    latest = checkpoints.latest_checkpoint(str(tmp_path), set_aside=True)  # what a training run does
    assert latest is not None and checkpoints.checkpoint_step(latest) == 10
    assert "its files set aside as damaged-model.ckpt-20.*; using model.ckpt-10" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("damaged-*")) == [
        "damaged-model.ckpt-20.data-00000-of-00001", "damaged-model.ckpt-20.index"]
    checkpoints.write_checkpoint(str(tmp_path), 30, {**WEIGHTS, "global_step": np.asarray(30, np.int64)}, 2)
    assert [checkpoints.checkpoint_step(p) for p in checkpoints.all_checkpoints(str(tmp_path))] == [10, 30]


def test_every_checkpoint_damaged_is_refused(tmp_path):
    _write(tmp_path, 10)
    (tmp_path / "model.ckpt-10.data-00000-of-00001").write_bytes(b"x")
    with pytest.raises(CSRunError, match=r"every checkpoint in .* is damaged; the newest, .*model.ckpt-10"):
        checkpoints.latest_checkpoint(str(tmp_path))


def _hold_lock(model_dir: Path) -> subprocess.Popen:
    code = ("import sys, time; from tf_model.model_dir_lock import lock_model_dir; "
            "lock_model_dir(sys.argv[1]); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(model_dir)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_naming_the_first_and_a_dead_ones_lock_is_taken_over(tmp_path, capsys):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(CSRunError) as refused:
            with model_dir_locked(str(tmp_path)):
                pass
        assert f"is in use by another run: pid {holder.pid} on host {socket.gethostname()}" in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    (tmp_path / f".model.ckpt-5.tmp-{holder.pid}.data-00000-of-00001.tempstate123").write_bytes(b"")
    (tmp_path / f"checkpoint.tmp-{holder.pid}").write_text("")
    with model_dir_locked(str(tmp_path)):
        assert f"from a run that ended without releasing it (pid {holder.pid}" in capsys.readouterr().out
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]  # leftovers cleaned
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: nothing stale to report


ADAM = {"dense/kernel": np.ones((2, 3), np.float32), "dense/bias": np.zeros(3, np.float32),
        "dense/kernel/Adam": np.ones((2, 3), np.float32), "dense/kernel/Adam_1": np.ones((2, 3), np.float32),
        "dense/bias/Adam": np.ones(3, np.float32), "dense/bias/Adam_1": np.ones(3, np.float32),
        "beta1_power": np.float32(0.5), "beta2_power": np.float32(0.9), "global_step": np.int64(7)}


def _program(optimizer: str) -> pb.Program:
    return pb.Program(kernels=[pb.Kernel(params=[pb.Param(variable="dense/kernel", shape=[2, 3]),
                                                 pb.Param(variable="dense/bias", shape=[3])])],
                      optimizer=pb.Optimizer(type=optimizer))


def test_cs_path_resumes_weights_with_fresh_state_for_another_optimizer(capsys):
    assert sorted(cs_state(_program("sgd"), ADAM, "ckpt-7")) == ["dense/bias", "dense/kernel"]
    assert "ckpt-7 holds Adam optimizer state and this model trains with plain gradient descent" \
        in capsys.readouterr().out
    assert sorted(cs_state(_program("momentum"), ADAM)) == ["dense/bias", "dense/kernel"]
    assert len(cs_state(_program("adam"), ADAM)) == 8  # the same optimizer: every slot and power
    assert capsys.readouterr().out.count("optimizer state starts fresh") == 1


@pytest.mark.slow
def test_cpu_path_resumes_weights_with_fresh_state_for_another_optimizer(tmp_path, capsys):
    """Adam to SGD and SGD to Momentum on the CPU path (FC-MNIST's run flow, in process): the
    same line and the same choice as the CS path (weights and step resume, the optimizer
    starts fresh), and training goes on."""
    from examples.fc_mnist.data import eval_input_fn, train_input_fn
    from examples.fc_mnist.model import PARAMS_SPEC, model_fn
    from launcher.run_flow import run
    from tests.e2e.test_reliability_bad_inputs import write_params
    from tests.fc_mnist_runs import EXAMPLE

    model_dir = tmp_path / "m"

    def train(optimizer: str, steps: int) -> str:
        params = write_params(tmp_path, {"optimizer.optimizer_type": optimizer})
        capsys.readouterr()
        run(model_fn, train_input_fn, eval_input_fn, here=str(EXAMPLE), params_spec=PARAMS_SPEC,
            argv=["-p", str(params), "-o", str(model_dir), "--max_steps", str(steps)])
        return capsys.readouterr().out

    train("adam", 2)
    out = train("sgd", 4)
    assert "holds Adam optimizer state and this model trains with plain gradient descent" in out
    assert "global step 4:" in out
    out = train("momentum", 6)
    assert "holds no optimizer state and this model trains with Momentum" in out
    stored = dict(checkpoints.read_checkpoint(checkpoints.latest_checkpoint(str(model_dir))))
    assert int(stored["global_step"]) == 6 and not any("Adam" in n for n in stored)


def test_a_checkpoint_without_dropout_rng_state_restores_on_the_cpu_path(tmp_path, capsys):
    """A CS checkpoint holds weights, slots and the step, not Keras's dropout RNG state: the
    CPU path resumes it (it is not 'another model')."""
    from examples.fc_mnist.data import eval_input_fn, train_input_fn
    from examples.fc_mnist.model import PARAMS_SPEC, model_fn
    from launcher.run_flow import run
    from tests.e2e.test_reliability_bad_inputs import write_params
    from tests.fc_mnist_runs import EXAMPLE

    params = write_params(tmp_path, {"model.dropout": 0.5, "runconfig.max_steps": 1})
    model_dir = tmp_path / "m"

    def train(steps: int) -> None:
        run(model_fn, train_input_fn, eval_input_fn, here=str(EXAMPLE), params_spec=PARAMS_SPEC,
            argv=["-p", str(params), "-o", str(model_dir), "--max_steps", str(steps)])

    train(1)
    latest = checkpoints.latest_checkpoint(str(model_dir))
    tensors = checkpoints.read_checkpoint(latest)
    assert any("seed_generator_state" in n for n in tensors)
    cs_like = {n: a for n, a in tensors.items() if "seed_generator" not in n}
    checkpoints.write_checkpoint(str(model_dir), 1, cs_like, 5)
    train(2)
    assert "global step 2:" in capsys.readouterr().out


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system (tmpfs; root, as CI runs)."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("a full disk is made with a small tmpfs: root needed")
        pytest.skip("a full disk is made with a small tmpfs: root needed")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_the_earlier_ones_stay(small_disk):
    _write(small_disk, 10)
    before = {p.name: p.read_bytes() for p in small_disk.iterdir()}
    big = {"dense/kernel": np.ones((1000, 1000), np.float32), "global_step": np.asarray(20, np.int64)}
    with pytest.raises(CSRunError, match=r"^no space left on the device of .* to write checkpoint 20 "
                                         r"\(it needs about 4.0 MB\) \(hint: ") as raised:
        checkpoints.write_checkpoint(str(small_disk), 20, big, 5)
    assert "the checkpoints before it are intact" in raised.value.hint
    assert {p.name: p.read_bytes() for p in small_disk.iterdir()} == before  # no leftovers, nothing torn
    assert _step(small_disk) == 10


def test_a_full_disk_while_compiling_is_one_line(small_disk):
    import compiler_models as m

    from coordinator.compiler import compile_model

    with pytest.raises(CSRunError, match=r"^no space left on the device of .*cs_compile to write the compile "
                                         r"\(it needs about [\d.]+ MB\) \(hint: "):
        compile_model(m.keras_mlp, m.input_fn, {"batch_size": 32, "hidden": [500, 300]}, str(small_disk))
