"""The environment csrun_wse gives every task of a job: the one channel from the launcher to
a task's process (read by `coordinator.roles`, the task's log line in `slurm.task_logs`, and
the user API's site configuration)."""
from __future__ import annotations

JOB_ID = "CSRUN_JOB_ID"  # the job's id (its folder's name)
JOB_DIR = "CSRUN_JOB_DIR"  # the launcher's job folder (rendezvous files, task logs)
TASK_RANK = "CSRUN_TASK_RANK"  # set by hand for a task started outside a launcher
NUM_TASKS = "CSRUN_NUM_TASKS"
CS_IP = "CSRUN_CS_IP"  # HOST:PORT of the job's CS system
CS_WAIT_S = "CSRUN_CS_WAIT_S"  # seconds the chief waits for a CS busy with another job (csrun_wse --cs-wait)
CS_TLS_CA = "CSRUN_CS_TLS_CA"  # the CA file the CS's TLS is verified with ("": plaintext)
