"""csrun_job: the jobs `csrun_wse` started, attached or `--detach`ed, on either backend.

    csrun_job list                              this user's jobs, newest first
    csrun_job status ID                         state, step, loss, rates, ETA, tasks, CS, logs, checkpoint
    csrun_job logs ID [--task N] [--follow]     the chief's log (or task N's), followed until the job ends
    csrun_job cancel ID                         stop every task (and the embedded CS)
    csrun_job cs [--cs_ip HOST:PORT]            who holds the CS system, who waits for it

ID is what `csrun_wse` printed (the Slurm job id, or the local job's id), or a job folder.
Everything is read from the job registry (`slurm.jobs`): the job folder's records, the
chief's progress, the backend's state. An unknown id, another user's job, or cancelling a job
that ended is one line and exit code 1. `cs` answers from Slurm's queue (the jobs holding
or waiting for the site's CS GRES or license) and, with `--cs_ip`, from the CS itself (what
`wse_sim status` says: idle, or the job holding it, its user, since when, its step), adding
the step count and folder when the job is one of this user's.
"""
from __future__ import annotations

import sys
import time

from common.errors import ArgumentParser, CSRunError, cli_entry
from cs_api.client import cs_status, holder_text
from launcher.progress_line import duration, loss_text
from launcher.run_config import normalize_cs_ip
from launcher.site_config import load_site_config
from slurm import jobs
from slurm.slurm_backend import cs_queue, slurm_answers
from slurm.task_logs import LogCopy, task_hosts, task_pid

PROG = "csrun_job"
_FOLLOW_POLL_S = 0.5


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description="List, watch and cancel the jobs csrun_wse started.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    sub.add_parser("list", help="this user's jobs, newest first")
    status = sub.add_parser("status", help="where a job is")
    status.add_argument("job", metavar="ID")
    logs = sub.add_parser("logs", help="a task's log (the chief's by default)")
    logs.add_argument("job", metavar="ID")
    logs.add_argument("--task", type=int, default=0, metavar="N", help="task N's log (default 0, the chief)")
    logs.add_argument("--follow", "-f", action="store_true", help="follow the log until the job ends")
    cancel = sub.add_parser("cancel", help="stop every task of a job")
    cancel.add_argument("job", metavar="ID")
    cs = sub.add_parser("cs", help="who holds the CS system, who waits for it")
    cs.add_argument("--cs_ip", help="HOST:PORT of a CS system to ask (default: Slurm's queue only)")
    for parser in (status, logs, cancel, cs):
        parser.error = p.error  # type: ignore[method-assign]  # one line, as the top parser's
    return p


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def list_jobs() -> int:
    records = jobs.all_jobs()
    if not records:
        print(f"no jobs (csrun_wse registers each job it starts in {jobs.index_dir()})")
        return 0
    rows = [("ID", "BACKEND", "STATE", "STEP", "LOSS", "SAMPLES/S", "STARTED", "FOLDER")]
    for record in records:
        state = jobs.job_state(record)
        progress = jobs.Progress.read(record.path)
        rows.append((record.job_id, record.backend, state.state,
                     f"{progress.step}/{progress.end_step}" if progress else "-",
                     loss_text(progress.loss) if progress else "-",
                     f"{progress.samples_per_sec:,.0f}" if progress else "-",
                     _when(record.started), record.folder))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0


def status(job_id: str) -> int:
    record = jobs.find(job_id)
    state = jobs.job_state(record)
    progress = jobs.Progress.read(record.path)
    lines = [f"job {record.job_id} ({record.backend} backend): {state}",
             f"  command:    {' '.join(record.command)}  (in {record.workdir})",
             f"  started:    {_when(record.started)} by csrun_wse on {record.host}"
             + ("" if record.launcher_pid is None else f" (pid {record.launcher_pid}, attached)")]
    if progress is not None:
        eta = progress.eta_s if not state.ended else None
        lines += [f"  step:       {progress.step} / {progress.end_step}"
                  + (f", ETA {duration(eta)}" if eta is not None else "")
                  + (" (finished)" if progress.finished else ""),
                  f"  loss:       {loss_text(progress.loss)} (updated {_when(progress.updated)})",
                  f"  samples/s:  {progress.samples_per_sec:,.0f} wall clock, "
                  f"{progress.sim_samples_per_sec:,.0f} simulated CS system",
                  f"  checkpoint: {progress.checkpoint or 'none yet'}"]
        if progress.starvation:
            lines.append(f"  input:      {progress.starvation}")
    else:
        lines.append("  step:       no training progress yet")
    restarts = jobs.requeues(record)
    if restarts:
        lines.append(f"  requeued:   {restarts} time(s) by Slurm, each run resuming from the newest checkpoint")
    lines.append(f"  CS system:  {record.cs_ip}" + (" (embedded simulator)" if record.embedded else ""))
    for rank in range(record.num_tasks):
        hosts, pid = task_hosts(record.task_log(rank)), task_pid(record.task_log(rank))
        role = "chief" if rank == 0 else "input worker"
        where = (f"on {hosts[0]}" + (f", pid {pid}" if pid else "")) if hosts else "not started"
        lines.append(f"  task {rank} ({role}, {where}): {record.task_log(rank)}")
    print("\n".join(lines))
    return 0


def logs(job_id: str, task: int, follow: bool) -> int:
    record = jobs.find(job_id)
    if not 0 <= task < record.num_tasks:
        raise CSRunError(f"job {record.job_id} has no task {task}", f"its tasks are 0..{record.num_tasks - 1}")
    copy = LogCopy(record.task_log(task), sys.stdout)
    if not follow:
        if not record.task_log(task).exists():
            raise CSRunError(f"task {task} of job {record.job_id} has no log yet ({jobs.job_state(record)})",
                             f"csrun_job logs {job_id} --follow waits for it")
        copy.copy_new(final=True)
        return 0
    while not jobs.job_state(record).ended:
        copy.copy_new()
        time.sleep(_FOLLOW_POLL_S)
    time.sleep(_FOLLOW_POLL_S)  # what the last task wrote as the job ended
    copy.copy_new(final=True)
    return 0


def cancel(job_id: str) -> int:
    record = jobs.find(job_id)
    state = jobs.job_state(record)
    if state.ended:
        raise CSRunError(f"job {record.job_id} already ended: {state}", "nothing to cancel")
    stopped = jobs.cancel(record)
    progress = jobs.Progress.read(record.path)
    checkpoint = f"; newest checkpoint {progress.checkpoint}" if progress and progress.checkpoint else ""
    print(f"{PROG}: job {record.job_id} cancelled: {stopped.state}{checkpoint}", file=sys.stderr)
    return 0 if stopped.ended else 1


def _step(record: jobs.JobRecord | None) -> str:
    progress = jobs.Progress.read(record.path) if record is not None else None
    return f", step {progress.step}/{progress.end_step}" if progress is not None else ""


def cs_holders(cs_ip: str | None) -> int:
    mine = {record.job_id: record for record in jobs.all_jobs()}
    lines = []
    if slurm_answers(2.0):
        site = load_site_config().slurm
        queue = cs_queue(site.gres, site.licenses)
        what = " and ".join(f"{kind} {name}" for kind, name in (("GRES", site.gres), ("license", site.licenses))
                            if name)
        if not queue:
            lines.append(f"Slurm: no job holds or waits for the CS system ({what})")
        for row in queue:
            record = mine.get(row["job_id"])
            if row["state"] == "RUNNING":
                lines.append(f"Slurm: job {row['job_id']} of {row['user']} holds the CS system ({what}) since "
                             f"{row['start']} on {row['nodes']}{_step(record)}")
            else:
                reason = row["reason"] if row["reason"] not in ("", "None") else "not scheduled yet"
                start = row["start"] if row["start"] not in ("", "N/A") else "not known yet"
                lines.append(f"Slurm: job {row['job_id']} of {row['user']} waits ({reason}), expected start {start}")
    if cs_ip is not None:
        address = normalize_cs_ip(cs_ip)
        reply = cs_status(address, load_site_config().cs.tls_ca)
        # the CS knows a job by its folder's name (the chief's job id)
        yours = [r for r in mine.values() if r.cs_ip == address and r.path.name == reply.job_id
                 and reply.state != "idle"]
        lines.append(f"CS system at {address}: {holder_text(reply)}" + "".join(
            f" (your job {r.job_id}{_step(r)}, job folder {r.folder})" for r in yours[:1]))
    if not lines:
        raise CSRunError("no Slurm answers here and no CS system was named", "give --cs_ip HOST:PORT")
    print("\n".join(lines))
    return 0


@cli_entry(PROG)
def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if ns.action == "list":
        return list_jobs()
    if ns.action == "status":
        return status(ns.job)
    if ns.action == "logs":
        return logs(ns.job, ns.task, ns.follow)
    if ns.action == "cs":
        return cs_holders(ns.cs_ip)
    return cancel(ns.job)


if __name__ == "__main__":
    sys.exit(main())

