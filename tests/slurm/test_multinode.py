"""csrun_wse across three Slurm hosts (network namespaces on a bridge) with the CS system on a
fourth: an unseen model trains with the CPU path's losses, tasks land where the layout flags
say (read from the tasks' own logs: Slurm's node name and the address each task reached the
CS from), a host dropping off the network ends the job naming it and a rerun on the remaining
hosts resumes to the unbroken run's weights, and an unreachable CS host is one line."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml
from fc_mnist_runs import ENV, losses
from processes import run_py_in_process, together

from slurm.task_logs import task_hosts
from tf_model import checkpoints

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.slow]

STEPS, EVERY = 60, 10  # each of the 5 input workers streams 12 batches over the bridge

# An MLP on scikit-learn's 8x8 digits, written the way a user writes one (Keras layers, a
# tf.compat.v1 loss and optimizer); no example of the repository has it.
RUN_PY = '''
import os

import tensorflow as tf
from sklearn.datasets import load_digits

from launcher.estimator import CSEstimatorSpec, ModeKeys
from launcher.run_flow import run


def input_fn(params):
    images, labels = load_digits(return_X_y=True)
    dataset = tf.data.Dataset.from_tensor_slices(((images / 16.0).astype("float32"), labels.astype("int32")))
    dataset = dataset.shuffle(len(labels), seed=7, reshuffle_each_iteration=True).repeat()
    return dataset.batch(params["train_input"]["batch_size"], drop_remainder=True)


def model_fn(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(params["model"]["hidden"], activation="tanh")(features)
    hidden = tf.keras.layers.Dense(params["model"]["hidden"] // 2, activation="relu")(hidden)
    logits = tf.keras.layers.Dense(10)(hidden)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = None
    if mode == ModeKeys.TRAIN:
        train_op = tf.compat.v1.train.AdamOptimizer(params["optimizer"]["learning_rate"]).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)


if __name__ == "__main__":
    run(model_fn, input_fn, input_fn, here=os.path.dirname(os.path.abspath(__file__)))
'''


def write_user_dir(folder: Path, steps: int = STEPS) -> Path:
    """The user's script, params and csrun.yaml (the site's: the CS system is a license here)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "run.py").write_text(RUN_PY)
    (folder / "configs").mkdir(exist_ok=True)
    params = {"train_input": {"batch_size": 32}, "model": {"hidden": 48},
              "optimizer": {"learning_rate": 0.01},
              "runconfig": {"max_steps": steps, "save_checkpoints_steps": EVERY, "save_summary_steps": EVERY,
                            "log_step_count_steps": 1, "keep_checkpoint_max": 3, "tf_random_seed": 11,
                            "fabric": "cs1", "model_dir": "model"}}
    (folder / "configs" / "params.yaml").write_text(yaml.safe_dump(params))
    (folder / "csrun.yaml").write_text(yaml.safe_dump({"slurm": {"gres": None, "licenses": "cs:1"}}))
    return folder


def csrun_wse_argv(cluster, job: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "launcher.csrun_wse", *flags, "--cs_ip", cluster.cs_ip, "--job-dir", job,
            "--", "python", "run.py", "--mode", "train"]


def csrun_wse(cluster, folder: Path, job: str, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(csrun_wse_argv(cluster, job, *flags), cwd=folder, env={**ENV, **_slurm(cluster)},
                          capture_output=True, text=True, timeout=timeout)


def _slurm(cluster) -> dict[str, str]:
    return {"SLURM_CONF": cluster.env["SLURM_CONF"]}


def job_id(stderr: str) -> str:
    return re.search(r"csrun_wse: job (\d+):", stderr).group(1)


def placement(folder: Path, job: str, jid: str, num_tasks: int) -> list[tuple[str, str]]:
    """(node, address) where each task really ran, from its own first log line."""
    return [task_hosts(folder / job / f"{jid}_{rank}_log.out") for rank in range(num_tasks)]


@pytest.fixture(scope="module")
def cpu_losses(tmp_path_factory) -> dict[int, float]:
    """The user's run.py on the CPU (in process): its losses."""
    folder = write_user_dir(tmp_path_factory.mktemp("cpu"), steps=12)
    return losses(run_py_in_process(folder / "run.py", ["--mode", "train"], folder))


@pytest.fixture(scope="module")
def unbroken(multinode_cluster, tmp_path_factory):
    """The 3-node job of the unseen model, to its end: (folder, its output)."""
    folder = write_user_dir(tmp_path_factory.mktemp("unbroken"))
    done = csrun_wse(multinode_cluster, folder, "job", "--total-nodes", "3", "--tasks-per-node", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, done


def test_three_hosts_train_with_the_cpu_losses_and_reach_the_cs_on_its_own_host(multinode_cluster, unbroken,
                                                                              cpu_losses):
    folder, done = unbroken
    assert "through the slurm backend" in done.stderr
    cs = losses(done.stdout)
    assert sorted(cs) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([cs[s] for s in sorted(cpu_losses)], [cpu_losses[s] for s in sorted(cpu_losses)],
                               rtol=1e-3)
    jid = job_id(done.stderr)
    where = placement(folder, "job", jid, 6)
    addresses = multinode_cluster.addresses
    assert [node for node, _ in where] == ["node1", "node1", "node2", "node2", "node3", "node3"]
    assert all(address == addresses[node] for node, address in where)  # each from its own host
    cs_host = multinode_cluster.cs_ip.rsplit(":", 1)[0]
    assert cs_host not in {address for _, address in where} | {"127.0.0.1"}
    for rank in range(1, 6):  # every input worker streamed its shard over the bridge
        log = (folder / "job" / f"{jid}_{rank}_log.out").read_text()
        assert f"input worker {rank - 1}: sent {STEPS // 5} batches" in log
    assert checkpoints.checkpoint_step(checkpoints.latest_checkpoint(str(folder / "model"))) == STEPS


def csrun_wse_command(cluster, folder: Path, job: str, command: str, *flags: str, **popen):
    """csrun_wse running a shell command (not a training) in every task, from the user's folder."""
    write_user_dir(folder)
    argv = [sys.executable, "-m", "launcher.csrun_wse", *flags, "--cs_ip", cluster.cs_ip, "--job-dir", job,
            "--", "sh", "-c", command]
    return subprocess.Popen(argv, cwd=folder, env={**ENV, **_slurm(cluster)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.parametrize("flags, nodes", [
    (("--single-task-nodes", "1"), ["node1", "node2", "node2", "node3", "node3"]),
    (("--single-task-nodes", "1", "--cyclic"), ["node1", "node2", "node3", "node2", "node3"]),
    (("--cyclic",), ["node1", "node2", "node3", "node1", "node2", "node3"]),
])
def test_layout_flags_place_the_tasks_as_the_original(multinode_cluster, tmp_path, flags, nodes):
    process = csrun_wse_command(multinode_cluster, tmp_path, "job", 'echo "rank $SLURM_PROCID ran"',
                                "--total-nodes", "3", "--tasks-per-node", "2", *flags)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, out + err
    where = placement(tmp_path, "job", job_id(err), len(nodes))
    assert [node for node, _ in where] == nodes
    assert all(address == multinode_cluster.addresses[node] for node, address in where)


def test_a_crashed_host_ends_the_job_naming_it_and_its_tasks(multinode_cluster, tmp_path):
    process = csrun_wse_command(multinode_cluster, tmp_path, "job", "sleep 600", "--total-nodes", "3",
                                "--tasks-per-node", "2")
    try:
        for line in process.stderr:
            if "csrun_wse: job" in line:
                jid = job_id(line)
                break
        logs = [tmp_path / "job" / f"{jid}_{rank}_log.out" for rank in range(6)]
        deadline = time.monotonic() + 60
        while not all(task_hosts(log) for log in logs) and time.monotonic() < deadline:
            time.sleep(0.5)
        multinode_cluster.crash("node2")  # slurmd and every process of the host, at once
        crashed = time.monotonic()
        _, err = process.communicate(timeout=120)
        ended_after = time.monotonic() - crashed
    finally:
        process.kill()
        if process.returncode is None:
            process.wait()
        multinode_cluster.restore()
    assert process.returncode != 0
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and re.search(r"task 2 \(input worker\) failed: its node node2 \(10\.\S+\) failed "
                                          r".*task\(s\) on node2: 2, 3", errors[0]), err
    assert ended_after < 60, f"the job ended {ended_after:.0f} s after node2 crashed"


def test_a_host_dropping_off_ends_the_job_naming_it_and_a_rerun_resumes(multinode_cluster, tmp_path):
    # A run far longer than the workers can buffer: node3 drops off while it trains.
    folder = write_user_dir(tmp_path / "broken", steps=100_000)
    process = subprocess.Popen(csrun_wse_argv(multinode_cluster, "job", "--total-nodes", "3", "--tasks-per-node",
                                              "2"), cwd=folder, env={**ENV, **_slurm(multinode_cluster)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if f"Saving checkpoints for {2 * EVERY} " in line:
                break
        multinode_cluster.link("node3", up=False)
        cut = time.monotonic()
        _, err = process.communicate(timeout=120)
        ended_after = time.monotonic() - cut
    finally:
        process.kill()
        if process.returncode is None:
            process.wait()
    try:
        assert process.returncode != 0
        errors = [line for line in err.splitlines() if "error:" in line]
        assert len(errors) == 1, err
        assert re.search(r"task [45] \(input worker\) failed: its node node3 \(10\.\S+\) failed .*"
                         r"task\(s\) on node3: 4, 5", errors[0]), errors[0]
        assert ended_after < 60, f"the job ended {ended_after:.0f} s after node3 dropped off"
        newest = checkpoints.latest_checkpoint(str(folder / "model"))
        step = checkpoints.checkpoint_step(newest)
        assert step >= 2 * EVERY and step % EVERY == 0
        state = checkpoints.read_checkpoint(newest)  # intact: every tensor reads back, finite
        assert all(np.all(np.isfinite(v)) for v in state.values() if v.dtype.kind == "f")

        # node3 is down: the rerun gets the two remaining hosts and resumes from the newest checkpoint
        # to the weights of a run that was never broken (meanwhile, on this host's embedded CS
        # system: the CS host serves one job at a time; one task: the chief feeds itself)
        end = step + EVERY
        write_user_dir(folder, steps=end)
        unbroken = write_user_dir(tmp_path / "unbroken", steps=end)
        local = {k: v for k, v in ENV.items() if k != "SLURM_CONF"}
        done, reference_run = together(
            partial(csrun_wse, multinode_cluster, folder, "job2", "--total-nodes", "2", "--tasks-per-node", "2"),
            partial(subprocess.run, [sys.executable, "-m", "launcher.csrun_wse", "--tasks-per-node", "1",
                                     "--job-dir", "job", "--", "python", "run.py", "--mode", "train"],
                    cwd=unbroken, env=local, capture_output=True, text=True, timeout=300))
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Restoring parameters from model/model.ckpt-{step}\n" in done.stdout
        assert sorted(losses(done.stdout)) == list(range(step + 1, end + 1))
        assert {node for node, _ in placement(folder, "job2", job_id(done.stderr), 4)} == {"node1", "node2"}
        assert reference_run.returncode == 0, reference_run.stdout + reference_run.stderr
        resumed = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(str(folder / "model")))
        reference = checkpoints.read_checkpoint(checkpoints.latest_checkpoint(str(unbroken / "model")))
        assert sorted(resumed) == sorted(reference)
        for name in reference:
            np.testing.assert_allclose(resumed[name], reference[name], rtol=1e-6, atol=1e-7, err_msg=name)
    finally:
        multinode_cluster.restore()


def test_an_unreachable_cs_host_is_one_line_naming_its_address(multinode_cluster, tmp_path):
    folder = write_user_dir(tmp_path, steps=2)
    multinode_cluster.link("cs", up=False)
    try:
        done = csrun_wse(multinode_cluster, folder, "job", "--total-nodes", "1")
    finally:
        multinode_cluster.link("cs", up=True)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"cannot reach the CS system at {multinode_cluster.cs_ip}" in errors[0], done.stderr
    assert "Traceback" not in done.stderr
