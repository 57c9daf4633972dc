"""cs_input_analyzer: the cost model, the recommendation, the command line, end to end."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common.errors import CSRunError
from launcher.input_analyzer import (
    InputCosts,
    JobModel,
    Recommendation,
    StreamCosts,
    job_slots,
    main,
    parse_args,
    recommend,
)
from launcher.input_measurement import compile_script, script_argv
from tests.fc_mnist_runs import ENV, EXAMPLE

ROOT = Path(__file__).resolve().parents[2]
ANALYZER = [sys.executable, "-c", "import sys; from launcher.input_analyzer import main; sys.exit(main())"]


def test_costs_interpolate_and_extrapolate_the_measurements():
    costs = InputCosts(100, ((1, 0.001), (2, 0.001), (4, 0.002), (8, 0.004)), cpus=2)
    assert costs.seconds_per_batch(1) == 0.001 and costs.seconds_per_batch(3) == pytest.approx(0.0015)
    assert costs.slope == pytest.approx(0.0005)
    assert costs.seconds_per_batch(16) == pytest.approx(0.008)
    assert costs.worker_rate(4) == pytest.approx(50_000) and costs.total_rate(4) == pytest.approx(200_000)
    assert costs.total_rate(16) == pytest.approx(200_000) and costs.pipeline_limit == pytest.approx(200_000)
    # noise never makes a worker faster with more workers; no slope: no pipeline limit
    noisy = InputCosts(100, ((1, 0.002), (2, 0.0015)), cpus=1)
    assert noisy.seconds_per_batch(2) == 0.002 and noisy.pipeline_limit == math.inf
    assert noisy.total_rate(10) == pytest.approx(500_000)
    with pytest.raises(ValueError):
        InputCosts(100, ((2, 0.001),), cpus=1)


FREE = StreamCosts(wire=0.0, cs_wall=1e-9, cs_cpu=0.0)  # a CS that costs nothing: the workers decide


def test_recommend_the_fewest_workers_that_feed_the_cs():
    costs = InputCosts(100, ((1, 0.001), (2, 0.001)), cpus=2)  # 100k samples/s per worker, flat
    rec = recommend(JobModel(costs, FREE, 250_000, available_nodes=4, cpus_per_node=8))
    assert rec == Recommendation(1, 4, 2, 3, pytest.approx(250_000), "the compiled program's rate")
    assert rec.flags() == "--total-nodes 1 --tasks-per-node 4 --cpus-per-task 2" and not rec.input_bound


def test_recommend_input_bound_stops_near_the_best():
    # t(W) = (W + 1) ms: total(W) = 100 W / (W + 1) k samples/s: 50k, 66.7k, 75k ... toward 100k
    costs = InputCosts(100, ((1, 0.002), (2, 0.003), (4, 0.005), (8, 0.009)), cpus=1)
    rec = recommend(JobModel(costs, FREE, 1_000_000, available_nodes=2, cpus_per_node=4))
    # 8 slots: at most 7 workers (87.5k); 95 % of that needs 5 workers (83.3k): 6 tasks on 2 nodes
    assert (rec.total_nodes, rec.tasks_per_node, rec.cpus_per_task, rec.workers) == (2, 3, 1, 5)
    assert rec.input_bound and rec.samples_per_sec == pytest.approx(500_000 / 6)
    assert costs.pipeline_limit == pytest.approx(100_000)


def test_recommend_rounds_up_to_whole_nodes_and_caps_cpus():
    costs = InputCosts(10, ((1, 0.001), (2, 0.001)), cpus=64)  # 10k samples/s per worker
    rec = recommend(JobModel(costs, FREE, 40_000, available_nodes=3, cpus_per_node=4))
    # a worker gets a whole node's 4 CPUs: 1 task per node; 4 workers wanted, 2 available
    assert (rec.total_nodes, rec.tasks_per_node, rec.cpus_per_task, rec.workers) == (3, 1, 4, 2)
    assert rec.input_bound and rec.samples_per_sec == pytest.approx(20_000)
    lone = recommend(JobModel(costs, FREE, 40_000, available_nodes=1, cpus_per_node=4))
    assert (lone.total_nodes, lone.tasks_per_node, lone.workers) == (1, 1, 1)  # worker in the chief
    uneven = recommend(JobModel(InputCosts(10, ((1, 0.001),), 1), FREE, 45_000, available_nodes=2, cpus_per_node=4))
    assert (uneven.total_nodes, uneven.tasks_per_node, uneven.workers) == (2, 3, 5)
    assert job_slots(2, 2, 4) == (2, 2, 3)


def test_the_job_is_limited_by_the_cs_or_by_the_cpus_its_node_shares():
    costs = InputCosts(100, ((1, 0.004), (2, 0.004), (4, 0.004), (8, 0.004)), cpus=1, cpu_per_second=1.0)
    slow_cs = JobModel(costs, StreamCosts(wire=0.0, cs_wall=0.010, cs_cpu=0.010), 1e6, 1, 2)
    assert slow_cs.rate(1) == pytest.approx(10_000) and slow_cs.limited_by(8).startswith("the CS system")
    # 2 CPUs share the CS's 10 ms and every worker's 4 ms of a batch: 2 x 100 / 14 ms
    busy = JobModel(costs, StreamCosts(wire=0.0, cs_wall=0.005, cs_cpu=0.010), 1e6, 1, 2)
    assert busy.rate(8) == pytest.approx(200 / 0.014)
    assert busy.limited_by(8) == "the first node's 2 CPU(s) (the chief, the CS, 8 worker(s))"


def test_parse_and_script_argv(tmp_path, monkeypatch):
    args = parse_args(["--available-nodes", "3", "--cpus-per-node=16", "python", "run.py", "--mode", "train"])
    assert (args.available_nodes, args.cpus_per_node, args.batches) == (3, 16, 20)
    assert args.command == ("python", "run.py", "--mode", "train")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.py").write_text("")
    assert script_argv(("python3", "run.py", "--mode", "train")) == ["run.py", "--mode", "train", "--compile_only"]


@pytest.mark.parametrize("argv, message", [
    (["--bogus", "python", "run.py"], "unrecognized arguments: --bogus"),
    ([], "no command to analyze"),
    (["--available-nodes", "0", "python", "run.py"], "--available-nodes 0: must be at least 1"),
    (["--cpus-per-node", "x", "python", "run.py"], "invalid int value: 'x'"),
])
def test_parse_rejects_bad_arguments(argv, message):
    with pytest.raises(CSRunError, match=message):
        parse_args(argv)


def test_script_argv_rejects_what_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CSRunError, match="runs a Python training script, not 'bash train.sh'"):
        script_argv(("bash", "train.sh"))
    with pytest.raises(CSRunError, match="script nope.py not found"):
        script_argv(("python", "nope.py"))


def run_analyzer(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run(ANALYZER + args, cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.slow
def test_a_script_that_compiles_nothing_is_one_line(tmp_path):
    (tmp_path / "run.py").write_text("import sys\nprint('hello', sys.argv[1:])\n")
    done = run_analyzer(["python", "run.py"], tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stdout == "hello ['--compile_only']\n"
    assert done.stderr.strip().splitlines()[-1] == (
        "cs_input_analyzer: error: run.py --compile_only compiled nothing (hint: give a CSEstimator "
        "script whose --compile_only compiles (e.g. python run.py --mode train))")


def test_a_failing_compile_is_reported_and_argv_restored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("raise SystemExit(2)\n")
    argv = sys.argv[:]
    with pytest.raises(CSRunError, match=r"the compile \(bad.py --compile_only\) failed with exit code 2"):
        compile_script(("python", "bad.py"))
    assert sys.argv == argv


@pytest.mark.slow
def test_end_to_end_on_the_cnn_example(tmp_path):
    model_dir = tmp_path / "model_dir"
    done = run_analyzer(["--available-nodes", "2", "--cpus-per-node", "4", "--batches", "5",
                         "python", "run.py", "--mode", "train", "--model_dir", str(model_dir)],
                        ROOT / "examples" / "cnn_digits")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    reports = list((model_dir / "cs_compile").glob("*/compile_report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert f"({report['fabric']}, batch 64): the CS consumes up to " \
           f"{report['estimate']['samples_per_sec']:,.0f} samples/s" in out
    assert "5 batches of 64 samples" in out
    rows = out.split("limited by\n")[1].split("Recommended")[0].splitlines()
    assert [int(r.split()[0]) for r in rows if "polated" not in r] == [1, 2, 4, 8]
    flags = out.split("Recommended: ")[1].splitlines()[0].split()
    nodes, per_node, cpus = int(flags[1]), int(flags[3]), int(flags[5])
    assert 1 <= nodes <= 2 and 1 <= cpus <= 4 and per_node * cpus <= 4
    assert f"csrun_wse {' '.join(flags)} python run.py --mode train --model_dir {model_dir}" in out


@pytest.mark.slow
def test_mount_dirs_bind_into_the_sites_container(tmp_path):
    """With a container image in csrun.yaml the analyzer runs inside it (csrun.yaml's mount
    dirs, --mount-dirs and the current directory bound), as the original's ran through
    csrun_cpu; without one, --mount-dirs is unused and says so."""
    from test_csrun_cpu import APPTAINER_DOUBLE

    bin_dir, data, extra = tmp_path / "bin", tmp_path / "data", tmp_path / "extra"
    for folder in (bin_dir, data, extra):
        folder.mkdir()
    (bin_dir / "apptainer").write_text(APPTAINER_DOUBLE)
    (bin_dir / "apptainer").chmod(0o755)
    image = tmp_path / "csrun.sif"
    image.write_bytes(b"SIF")
    (tmp_path / "csrun.yaml").write_text(f"container: {{image: {image}}}\nmount_dirs: [{data}]\n")
    record = tmp_path / "args.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "DOUBLE_RECORD": str(record), "DOUBLE_IMAGE": str(image),
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("CSRUN_CONFIG", None)
    argv = ["--mount-dirs", str(extra), "python", "nope.py"]
    done = subprocess.run(ANALYZER + argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert record.read_text().splitlines() == ["exec", "--bind", f"{data},{extra},{tmp_path}", "--pwd",
                                               str(tmp_path), str(image), "cs_input_analyzer", *argv]
    lines = done.stderr.strip().splitlines()  # inside, the analyzer itself ran (once)
    assert lines.count(f"cs_input_analyzer: running in the apptainer container {image}") == 1, done.stderr
    assert lines[-1].startswith("cs_input_analyzer: error: script nope.py not found") and done.returncode == 1


def test_mount_dirs_without_a_container_say_they_are_unused(tmp_path, monkeypatch, capfd):
    (tmp_path / "csrun.yaml").write_text("mount_dirs: []\n")
    argv = ["--mount-dirs", str(tmp_path), "python", "nope.py"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CSRUN_CONFIG", raising=False)
    with pytest.raises(SystemExit, match="1"):  # script nope.py not found
        main(argv)
    assert f"cs_input_analyzer: --mount-dirs unused: no container.image in {tmp_path / 'csrun.yaml'}" in \
        capfd.readouterr().err


def test_help_and_argument_errors_answer_before_tensorflow_is_imported():
    """Each CLI's --help and a bad flag, one after the other in one fresh interpreter: after
    each, TensorFlow is still not imported."""
    calls = [(cli, args) for cli in ("launcher.input_analyzer", "launcher.csrun_wse", "launcher.csrun_cpu")
             for args in (["--help"], ["--no-such-flag"])]
    probe = "import importlib, sys\n" + "".join(
        f"try:\n    importlib.import_module({cli!r}).main({args!r})\nexcept SystemExit:\n    pass\n"
        f"print({cli!r}, {args[0]!r}, 'tensorflow imported:', 'tensorflow' in sys.modules)\n"
        for cli, args in calls)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    answers = [line for line in done.stdout.splitlines() if "tensorflow imported:" in line]
    assert answers == [f"{cli} {args[0]} tensorflow imported: False" for cli, args in calls], \
        done.stdout + done.stderr


PROGRESS = re.compile(r"^global step \d+: loss = \S+ \(([\d.]+) steps/sec\)", re.M)


@pytest.mark.slow
def test_the_prediction_lands_within_2x_of_the_jobs_rate_at_1_and_2_workers(tmp_path, capsys):
    """The analyzer's expected samples/s for W input workers against what `csrun_wse` with
    the chief and W workers (this host, its embedded simulator) streams from its 51st step to its 150th: FC-MNIST."""
    params = yaml.safe_load((EXAMPLE / "configs" / "params.yaml").read_text())
    params["runconfig"].update(max_steps=150, save_checkpoints_steps=None, save_summary_steps=1000,
                               log_step_count_steps=50)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    script = ["python", str(EXAMPLE / "run.py"), "-p", str(path)]
    assert main(["--batches", "5", *script, "-o", str(tmp_path / "analyzed")]) == 0
    out = capsys.readouterr().out
    print(out[out.index("Compiled program"):])
    rows = out.split("limited by\n")[1].split("Recommended")[0].splitlines()
    predicted = {int(row.split()[0]): float(row.split()[3].replace(",", "")) for row in rows}
    for workers in (1, 2):
        done = subprocess.run([sys.executable, "-m", "launcher.csrun_wse", "--tasks-per-node", str(workers + 1),
                               "--job-dir", str(tmp_path / f"job{workers}"), *script,
                               "-o", str(tmp_path / f"m{workers}")],
                              cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        steady = [float(rate) for rate in PROGRESS.findall(done.stdout)[1:]]  # after the first 50 steps
        # windows of 50 steps each: their overall rate is the harmonic mean (a window the CS
        # ran ahead of, its losses arriving in one burst, does not count as fast as it looks)
        measured = params["train_input"]["batch_size"] * len(steady) / sum(1 / r for r in steady)
        print(f"{workers} worker(s): predicted {predicted[workers]:,.0f}, measured {measured:,.0f} samples/s")
        assert 0.5 <= predicted[workers] / measured <= 2, (workers, predicted[workers], measured)
