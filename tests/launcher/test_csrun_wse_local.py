"""csrun_wse on the local backend: process management, roles, failures, Ctrl-C, dry run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import CSRunError
from coordinator.roles import run_cs_ip, task_role
from launcher.csrun_wse import fabric_of, parse_args
from launcher.run_config import normalize_cs_ip

CSRUN_WSE = [sys.executable, "-c", "import sys; from launcher.csrun_wse import main; sys.exit(main())"]
# A fake CS address: these tests exercise process management only (no CS is contacted).
NO_CS = ["--cs_ip", "127.0.0.1:1"]


def run(args, cwd, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(CSRUN_WSE + args, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def sh(script):
    return ["--", "sh", "-c", script]


def every_task_gone(marker: str, within_s: float = 5.0) -> bool:
    """No process runs the command `marker` (a job's task) within `within_s` seconds: a task's
    command may end a moment after the controller that stopped it (the machine may be loaded)."""
    deadline = time.monotonic() + within_s
    while subprocess.run(["pgrep", "-x", "-f", marker], capture_output=True).stdout:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_roles_from_environment():
    assert task_role({}).rank == 0 and task_role({}).num_tasks == 1
    role = task_role({"SUBMITIT_LOCAL_GLOBALID": "2", "SUBMITIT_LOCAL_NTASKS": "3",
                      "SUBMITIT_LOCAL_JOB_ID": "99", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert (role.rank, role.num_tasks, role.job_id, role.is_chief) == (2, 3, "99", False)
    assert (role.num_workers, role.worker_id) == (2, 1)
    slurm = task_role({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "5",
                       "CSRUN_JOB_DIR": "/j"})
    assert (slurm.is_chief, slurm.num_workers, slurm.worker_id, slurm.job_id, str(slurm.job_dir)) == \
        (True, 1, 0, "5", "/j")


def test_cs_ip_gets_the_default_port_and_bad_addresses_are_refused():
    assert normalize_cs_ip("10.0.0.5") == "10.0.0.5:9000"
    with pytest.raises(CSRunError):
        normalize_cs_ip("host:port")


def test_the_embedded_simulator_fabric_is_read_as_run_py_reads_params(tmp_path):
    example = tmp_path / "ex"
    (example / "configs").mkdir(parents=True)
    (example / "configs" / "params.yaml").write_text("runconfig:\n  fabric: cs2\n")
    (tmp_path / "other.yaml").write_text("runconfig:\n  fabric: cs2\n  max_steps: 3\n")
    (tmp_path / "bad.yaml").write_text("runconfig:\n  fabrik: cs2\n")
    # the script folder's configs/params.yaml, wherever the job starts, as run.py finds it
    assert fabric_of(("python", "ex/run.py", "--mode", "train"), tmp_path) == "cs2"
    assert fabric_of(("python", "run.py", "--mode", "train"), example) == "cs2"
    # -p / --params / --params= / an abbreviation, relative to the working directory
    assert fabric_of(("python", "run.py"), tmp_path) == "cs1"  # no configs/params.yaml here
    for flags in (("-p", "other.yaml"), ("--params", "other.yaml"), ("--params=other.yaml",), ("--par", "other.yaml")):
        assert fabric_of(("python", "run.py", *flags, "--help"), tmp_path) == "cs2", flags
    # the run itself reports a bad params file or flag; another command has no params
    assert fabric_of(("python", "ex/run.py", "-p", "bad.yaml"), tmp_path) == "cs1"
    assert fabric_of(("python", "ex/run.py", "--mode", "bogus"), tmp_path) == "cs1"
    assert fabric_of(("sh", "-c", "python ex/run.py"), tmp_path) == "cs1"
    # a fabric no simulator has: said here, before the simulator starts (it named only its log)
    (tmp_path / "cs9.yaml").write_text("runconfig:\n  fabric: cs9\n")
    with pytest.raises(CSRunError, match=r"unknown fabric 'cs9' \(runconfig.fabric in .*cs9.yaml\)"):
        fabric_of(("python", "ex/run.py", "-p", "cs9.yaml"), tmp_path)


def test_parse_rejects_bad_arguments():
    with pytest.raises(CSRunError, match="unrecognized arguments: --bogus"):
        parse_args(["--bogus", "python", "run.py"])
    with pytest.raises(CSRunError, match="no command"):
        parse_args(["--tasks-per-node", "2"])
    with pytest.raises(CSRunError, match="--tasks-per-node 0: must be at least 1"):
        parse_args(["--tasks-per-node", "0", "python", "run.py"])


def test_dry_run_prints_every_task_and_the_embedded_simulator(tmp_path):
    result = run(["--dry-run", "--tasks-per-node", "3", "--job-dir", str(tmp_path / "job"),
                  "python", "run.py", "--mode", "train"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("# embedded CS system: ") and "serve --fabric cs1 --host 127.0.0.1" in lines[0]
    port = lines[0].rsplit(" ", 1)[1]
    tasks = [ln for ln in lines if ln.startswith("SUBMITIT_LOCAL_GLOBALID=")]
    assert len(tasks) == 3
    assert all(f"CSRUN_CS_IP=127.0.0.1:{port} " in ln and ln.endswith(" python run.py --mode train")
               for ln in tasks)
    assert not (tmp_path / "job").exists()  # nothing started


def test_more_than_one_node_without_slurm_is_one_line_error(tmp_path):
    result = run(["--total-nodes", "2", *NO_CS, *sh("true")], tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "csrun_wse: error: --total-nodes 2: without Slurm the job runs on this host only "
        "(hint: use --total-nodes 1, or run csrun_wse where Slurm answers)"]


def test_three_tasks_run_with_their_ranks_and_chief_log_streams(tmp_path):
    job = tmp_path / "job"
    result = run(["--tasks-per-node", "3", "--job-dir", str(job), *NO_CS,
                  *sh('echo "rank $SUBMITIT_LOCAL_GLOBALID of $SUBMITIT_LOCAL_NTASKS cs $CSRUN_CS_IP"')],
                 tmp_path)
    assert result.returncode == 0, result.stderr
    assert "rank 0 of 3 cs 127.0.0.1:1" in result.stdout
    assert "rank 1" not in result.stdout  # only the chief's log goes to the terminal
    logs = sorted(job.glob("*_log.out"))
    assert len(logs) == 3
    for rank in range(3):
        log = next(p for p in logs if p.name.endswith(f"_{rank}_log.out"))
        assert f"rank {rank} of 3 cs 127.0.0.1:1" in log.read_text()


def test_a_reused_job_folder_starts_without_the_last_launch_rendezvous(tmp_path):
    job = tmp_path / "job"
    (job / "rendezvous").mkdir(parents=True)
    (job / "rendezvous" / "1-train.json").write_text("{}")  # an earlier launch's phase
    result = run(["--job-dir", str(job), *NO_CS, *sh(f"ls {job}/rendezvous 2>/dev/null | wc -l")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_a_failing_worker_stops_the_job_naming_it(tmp_path):
    marker = f"sleep 120.{os.getpid()}"
    script = ('if [ "$SUBMITIT_LOCAL_GLOBALID" = 2 ]; then sleep 1; '
              f'echo "run.py: error: worker went wrong" >&2; exit 7; fi; {marker}')
    start = time.monotonic()
    result = run(["--tasks-per-node", "3", "--job-dir", str(tmp_path / "job"), *NO_CS, *sh(script)],
                 tmp_path, timeout=60)
    assert time.monotonic() - start < 30
    assert result.returncode == 7
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("csrun_wse: error: task 2 (input worker) failed: run.py: error: worker went wrong")
    assert "_2_log.out" in last
    assert every_task_gone(marker)


def test_a_failing_chief_gives_its_exit_code(tmp_path):
    result = run(["--tasks-per-node", "2", *NO_CS, "--job-dir", str(tmp_path / "job"),
                  *sh('if [ "$SUBMITIT_LOCAL_GLOBALID" = 0 ]; then echo "chief: error: bad"; exit 3; fi; sleep 120')],
                 tmp_path)
    assert result.returncode == 3
    assert "chief: error: bad" not in result.stdout  # once, in the line naming the task and its log
    assert "task 0 (chief) failed: chief: error: bad" in result.stderr


@pytest.mark.parametrize("to", ["csrun_wse", "the terminal's process group"])
def test_ctrl_c_stops_every_task(tmp_path, to):
    job = tmp_path / "job"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    marker = f"sleep 97.{os.getpid()}"
    process = subprocess.Popen(CSRUN_WSE + ["--tasks-per-node", "2", "--job-dir", str(job), *NO_CS,
                                            *sh(f"echo started; {marker}")],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,  # a terminal's foreground group
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-x", "-f", marker], capture_output=True,
                         text=True).stdout.count("\n") != 2:
        assert time.monotonic() < deadline, "tasks did not start"
        time.sleep(0.2)
    if to == "csrun_wse":
        process.send_signal(signal.SIGINT)
    else:  # what Ctrl-C does: every process of the group (the local controller too) gets it
        os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert err.splitlines()[-1] == "csrun_wse: interrupted" and "Traceback" not in err, err
    assert every_task_gone(marker)


def test_a_failed_task_line_keeps_one_hint():
    from launcher.csrun_wse import with_hint

    task = "task 2 (input worker) failed: run.py: error: bad shape (hint: recompile)"
    assert with_hint(task, "its log: j/2.out") == (
        "task 2 (input worker) failed: run.py: error: bad shape (hint: recompile; its log: j/2.out)")
    assert with_hint("the job's tasks stopped", "logs in j") == "the job's tasks stopped (hint: logs in j)"


@pytest.mark.parametrize("command, message", [
    (["nosuchcommand"], "csrun_wse: error: command 'nosuchcommand' not found (hint: give a program on PATH"),
    (["python", "nosuch.py"], "csrun_wse: error: script nosuch.py not found in "),
    (["python", "broken.py", "--mode", "train"],
     "csrun_wse: error: broken.py, line 2: SyntaxError: '(' was never closed (hint: fix the script; nothing"),
])
def test_a_command_that_cannot_start_is_refused_before_anything_starts(tmp_path, command, message):
    (tmp_path / "broken.py").write_text("import os\nx = (\n")
    result = run(["--job-dir", str(tmp_path / "job"), "--", *command], tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(message) and len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "job").exists()  # no job folder, no simulator, no task


def test_cs_wait_reaches_the_chief_through_the_task_environment(tmp_path):
    from launcher.csrun_wse import job_request

    args = parse_args(["--cs_ip", "10.0.0.5", "--cs-wait", "600", "python", "run.py"])
    env = job_request(args, args.cs_ip, tmp_path).env
    assert task_role(env).cs_wait_s == 600 and run_cs_ip(environ=env) == "10.0.0.5:9000"
    assert task_role({}).cs_wait_s == 0
    with pytest.raises(CSRunError, match=r"--cs-wait -1.0: must be a number of seconds >= 0"):
        parse_args(["--cs-wait", "-1", "python", "run.py"])
