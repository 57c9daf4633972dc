"""csrun_wse and the sbatch templates against the real one-host Slurm (slurm/cluster/)."""
from __future__ import annotations

import re
import signal
import sys
import time

import pytest

from slurm.templates import TEMPLATES, fill

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

NO_CS = ["--cs_ip", "127.0.0.1:1"]  # these jobs never contact the CS
SHOW_RANK = """\
import os, sys
print(f"rank {os.environ['SLURM_PROCID']} of {os.environ['SLURM_NTASKS']} argv {sys.argv[1:]}", flush=True)
for key in sorted(os.environ):
    if key.startswith(("CSRUN_", "SLURM_")):
        print(f"{key}={os.environ[key]}")
"""


def job_id_of(stderr: str) -> str:
    return re.search(r"csrun_wse: job (\d+):", stderr).group(1)


def sacct(cluster, job_id: str) -> dict[str, str]:
    """The accounting's record of a job (empty while slurmdbd has none yet)."""
    out = cluster.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,Start,End"]).stdout.strip()
    return dict(zip(("State", "Start", "End"), out.split("|"))) if out else {"State": ""}


def wait_sacct(cluster, job_id: str, prefix: str, timeout: float = 60) -> dict[str, str]:
    """The accounting's record once its state starts with `prefix` (slurmdbd lags the controller)."""
    deadline = time.monotonic() + timeout
    while not (record := sacct(cluster, job_id))["State"].startswith(prefix):
        assert time.monotonic() < deadline, f"job {job_id}: {record}"
        time.sleep(0.5)
    return record


def wait_state(cluster, job_id: str, states: tuple[str, ...], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"]).stdout.strip()
        if state.split(" ")[0] in states and state != "PENDING None":  # None: not scheduled yet
            return state
        assert time.monotonic() < deadline, f"job {job_id} never reached {states}: {state!r}"
        time.sleep(0.3)


def test_tasks_run_with_their_ranks_and_the_dry_run_is_the_submitted_script(slurm_cluster, tmp_path):
    (tmp_path / "show_rank.py").write_text(SHOW_RANK)
    job = tmp_path / "job"
    args = ["--tasks-per-node", "3", *NO_CS, "--job-dir", str(job), "--", sys.executable, "show_rank.py"]
    dry = slurm_cluster.csrun_wse(["--dry-run", *args], tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert not job.exists()
    # an outer job's variables (as inside an allocation) must not leak into the new job
    done = slurm_cluster.csrun_wse(args, tmp_path, SLURM_JOB_ID="999", SLURM_NTASKS="7", SLURM_PROCID="5",
                                   SLURM_CPUS_PER_TASK="3", SBATCH_PARTITION="nope")
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stderr)
    assert "rank 0 of 3 argv []" in done.stdout  # the command runs as given: the CS is in CSRUN_CS_IP
    assert "rank 1" not in done.stdout  # only the chief's log streams to the terminal
    for rank in range(3):
        log = (job / f"{job_id}_{rank}_log.out").read_text()
        assert f"rank {rank} of 3" in log
        assert f"SLURM_JOB_ID={job_id}\n" in log and "CSRUN_CS_IP=127.0.0.1:1\n" in log
        assert f"CSRUN_JOB_DIR={job}\n" in log and "SLURM_CPUS_PER_TASK=3" not in log
    submitted = (job / f"{job_id}_submission.sh").read_text()
    assert dry.stdout == submitted
    ran = slurm_cluster.run(["scontrol", "write", "batch_script", job_id, "-"]).stdout
    assert ran == submitted
    assert "#SBATCH --gres=cs:1\n" in submitted and "#SBATCH --ntasks-per-node=3\n" in submitted
    wait_sacct(slurm_cluster, job_id, "COMPLETED")


def test_the_embedded_simulator_is_reached_from_the_job(slurm_cluster, tmp_path):
    probe = ("import os, grpc; from cs_api import pb, rpc; "
             "stub = rpc.CSSystemStub(grpc.insecure_channel(os.environ['CSRUN_CS_IP'])); "
             "stub.Status(pb.StatusRequest(), timeout=10); print('CS answered at', os.environ['CSRUN_CS_IP'])")
    done = slurm_cluster.csrun_wse(["--job-dir", str(tmp_path / "job"), "--", sys.executable, "-c", probe],
                                   tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CS answered at 127.0.0.1:" in done.stdout
    script = next((tmp_path / "job").glob("*_submission.sh")).read_text()
    assert re.search(r"^#SBATCH --nodelist=\S+$", script, re.M)  # pinned to this host


def test_two_jobs_never_share_the_cs(slurm_cluster, tmp_path):
    first = slurm_cluster.csrun_wse(["--detach", *NO_CS, "--job-dir", str(tmp_path / "a"), "--", "sleep", "6"],
                                    tmp_path)
    second = slurm_cluster.csrun_wse(["--detach", *NO_CS, "--job-dir", str(tmp_path / "b"), "--", "true"],
                                     tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = first.stdout.strip(), second.stdout.strip()
    assert a.isdigit() and b.isdigit()
    wait_state(slurm_cluster, a, ("RUNNING",))
    assert wait_state(slurm_cluster, b, ("PENDING",)) == "PENDING Resources"
    second_job = wait_sacct(slurm_cluster, b, "COMPLETED", timeout=120)
    first_job = wait_sacct(slurm_cluster, a, "COMPLETED")
    assert second_job["Start"] >= first_job["End"]  # ISO timestamps: the second began after the first ended


def test_scancel_ends_the_job_and_the_exit_code_says_so(slurm_cluster, tmp_path):
    process = slurm_cluster.csrun_wse_process(
        ["--tasks-per-node", "2", *NO_CS, "--job-dir", str(tmp_path / "job"), "--", "sh", "-c",
         "echo started; sleep 300"], tmp_path)
    try:
        line = process.stderr.readline()
        job_id = job_id_of(line)
        wait_state(slurm_cluster, job_id, ("RUNNING",))
        assert slurm_cluster.run(["scancel", job_id]).returncode == 0
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143
    assert f"csrun_wse: error: Slurm job {job_id} was cancelled (scancel)" in err
    wait_sacct(slurm_cluster, job_id, "CANCELLED")


def test_ctrl_c_cancels_the_job(slurm_cluster, tmp_path):
    process = slurm_cluster.csrun_wse_process(
        [*NO_CS, "--job-dir", str(tmp_path / "job"), "--", "sleep", "300"], tmp_path)
    try:
        job_id = job_id_of(process.stderr.readline())
        wait_state(slurm_cluster, job_id, ("RUNNING",))
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130 and "csrun_wse: interrupted" in err
    wait_sacct(slurm_cluster, job_id, "CANCELLED")


def test_a_failing_worker_fails_the_job_naming_it(slurm_cluster, tmp_path):
    script = ('if [ "$SLURM_PROCID" = 1 ]; then echo "run.py: error: worker went wrong" >&2; exit 7; fi; '
              "sleep 300")
    done = slurm_cluster.csrun_wse(["--tasks-per-node", "2", *NO_CS, "--job-dir", str(tmp_path / "job"),
                                    "--", "sh", "-c", script], tmp_path)
    assert done.returncode == 7
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("csrun_wse: error: task 1 (input worker) failed: run.py: error: worker went wrong")
    job_id = job_id_of(done.stderr)
    assert slurm_cluster.run(["squeue", "-h", "-t", "PD,R", "-j", job_id]).stdout.strip() == ""  # no task left


@pytest.mark.parametrize("args, message", [
    (["--partition", "nope"], "csrun_wse: error: Slurm has no partition 'nope' (hint: partitions here: "),
    (["--tasks-per-node", "500"], "csrun_wse: error: Slurm can never give this job 1 node(s) x 500 task(s)"),
    (["--total-nodes", "2"], "csrun_wse: error: Slurm can never give this job 2 node(s)"),
    (["--time", "soon"], "csrun_wse: error: Slurm refused the job: Invalid --time specification"),
])
def test_refused_jobs_are_one_line_and_submit_nothing(slurm_cluster, tmp_path, args, message):
    before = slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout
    done = slurm_cluster.csrun_wse([*args, *NO_CS, "--job-dir", str(tmp_path / "job"), "--", "true"], tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), done.stderr
    after = slurm_cluster.run(["squeue", "-h", "-o", "%i"]).stdout
    assert set(after.split()) <= set(before.split())  # no new job (earlier ones may have left)
    assert not (tmp_path / "job").exists()


def test_many_nodes_without_cs_ip_is_a_clear_error(slurm_cluster, tmp_path):
    done = slurm_cluster.csrun_wse(["--total-nodes", "2", "--", "true"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "csrun_wse: error: --total-nodes 2 without --cs_ip: the embedded CS simulator listens on this host's "
        "loopback, which other nodes cannot reach (hint: start `wse_sim serve --host ADDRESS` on a host the "
        "nodes reach and pass --cs_ip ADDRESS:PORT)"]


def test_the_emitted_csrun_wse_template_runs_under_plain_sbatch(slurm_cluster, tmp_path):
    (tmp_path / "show_rank.py").write_text(SHOW_RANK)
    emitted = slurm_cluster.csrun_wse(["--emit-sbatch", "job.sbatch", "--tasks-per-node", "2",
                                       "--", "python", "show_rank.py"], tmp_path)
    assert emitted.returncode == 0, emitted.stderr
    script = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=2\n" in script and "COMMAND=(python show_rank.py)\n" in script
    done = slurm_cluster.run(["sbatch", "--wait", "--parsable", "job.sbatch"], tmp_path)
    assert done.returncode == 0, done.stderr + (tmp_path / f"csrun_wse-{done.stdout.strip()}.out").read_text()
    job_id = done.stdout.strip()
    logs = tmp_path / "csrun_jobs" / f"slurm-{job_id}"
    for rank in range(2):  # the embedded simulator's address is in every task's CSRUN_CS_IP
        log = (logs / f"{job_id}_{rank}_log.out").read_text()
        assert f"rank {rank} of 2 argv []" in log and re.search(r"^CSRUN_CS_IP=127\.0\.0\.1:\d+$", log, re.M)
    assert (logs / "wse_sim.log").exists()


def test_the_csrun_cpu_template_runs_under_plain_sbatch(slurm_cluster, tmp_path):
    script = fill((TEMPLATES / "csrun_cpu.sbatch").read_text(), {},
                  {"COMMAND": f"({sys.executable} -c 'import sys; print(\"cpu node ok\", sys.prefix)')"})
    (tmp_path / "cpu.sbatch").write_text(script)
    done = slurm_cluster.run(["sbatch", "--wait", "--parsable", "cpu.sbatch"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cpu node ok" in (tmp_path / f"csrun_cpu-{done.stdout.strip()}.out").read_text()


APPTAINER_TEST_DOUBLE = """\
#!/bin/sh
# TEST DOUBLE of the apptainer binary (Apptainer cannot be installed here): it checks the
# `exec --bind B --pwd D IMAGE CMD...` shape, says what it was asked and runs CMD on the host.
[ "$1" = exec ] || { echo "apptainer test double: only exec" >&2; exit 2; }
shift
while [ $# -gt 0 ]; do
    case "$1" in --bind) binds=$2; shift 2 ;; --pwd) dir=$2; shift 2 ;; *) break ;; esac
done
image=$1; shift
[ -f "$image" ] || { echo "apptainer test double: no image $image" >&2; exit 255; }
echo "apptainer-double image=$image binds=$binds pwd=$dir"
cd "$dir" && exec "$@"
"""


def test_tasks_run_in_the_site_container(slurm_cluster, tmp_path):
    bin_dir, data, extra = tmp_path / "bin", tmp_path / "data", tmp_path / "extra"
    for folder in (bin_dir, data, extra):
        folder.mkdir()
    (bin_dir / "apptainer").write_text(APPTAINER_TEST_DOUBLE)
    (bin_dir / "apptainer").chmod(0o755)
    (tmp_path / "csrun.sif").write_text("image")
    (tmp_path / "csrun.yaml").write_text(
        f"container: {{image: csrun.sif, runtime: apptainer}}\nmount_dirs: [{data}]\nslurm: {{tasks_per_node: 2}}\n")
    path = f"{bin_dir}:{slurm_cluster.env['PATH']}"
    done = slurm_cluster.csrun_wse([*NO_CS, "--mount-dirs", str(extra), "--job-dir", str(tmp_path / "job"),
                                    "--", "sh", "-c", 'echo "rank $SLURM_PROCID"'], tmp_path, PATH=path)
    assert done.returncode == 0, done.stderr
    asked = f"apptainer-double image={tmp_path}/csrun.sif binds={data},{extra},{tmp_path} pwd={tmp_path}"
    assert done.stdout.splitlines()[:2] == [asked, "rank 0"]
    assert asked in next((tmp_path / "job").glob("*_1_log.out")).read_text()  # the site's 2 tasks


def test_single_task_nodes_hostfile_puts_the_chief_alone_first(slurm_cluster, tmp_path):
    from slurm.backend import JobRequest
    from slurm.slurm_backend import task_layout

    request = JobRequest(("true",), tmp_path, tmp_path, total_nodes=3, tasks_per_node=2)
    for cyclic, expected in (("0", "n1 n2 n2 n3 n3"), ("1", "n1 n2 n3 n2 n3")):
        tasks, setup = task_layout(request, {"single_task_nodes": "1", "cyclic": cyclic})
        assert tasks == 5
        script = "\n".join(["set -e", *setup, 'cat "$SLURM_HOSTFILE"'])
        done = slurm_cluster.run(["bash", "-c", script], tmp_path, SLURM_JOB_NODELIST="n[1-3]", SLURM_JOB_ID="7")
        assert done.stdout.split() == expected.split(), done.stderr
