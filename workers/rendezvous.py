"""How input workers learn what to stream, where, and with which token: a rendezvous file.

For every CS phase (each train / evaluate / predict call of the user's script) the chief
loads the program into the CS, then writes one small JSON file, atomically (temporary
name, then rename; mode 0600 because it holds the job's token):

    <job folder>/rendezvous/<phase>.json          when launched by csrun_wse (CSRUN_JOB_DIR)
    <model_dir>/cs_rendezvous/<job id>/<phase>.json  otherwise (e.g. a plain sbatch script)

`phase` is "<n>-<action>": the n-th CS call of the script (every task runs the same
script, so the n-th call of a worker matches the chief's n-th). Workers poll for the file
of their phase; the job id in the path keeps a stale file of an earlier job from being
read. The file names the CS address, the CS job id and token, the number of input
streams, which batches to send (`start_batch`, `num_batches` of input_fn's order) and the
program's inputs (name, dtype, batch shape) that each batch must match.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common.errors import CSRunError
from cs_api.input_spec import InputSpec


@dataclass(frozen=True)
class Rendezvous:
    cs_ip: str
    cs_job_id: str
    token: str
    num_workers: int
    start_batch: int   # first batch of input_fn's order this phase consumes
    num_batches: int   # batches the phase consumes (worker w sends those ≡ w mod num_workers)
    inputs: tuple[InputSpec, ...]
    batch_size: int
    # Non-empty: the phase streams nothing and this says why (the chief had nothing to do,
    # or stopped before it could start): the workers end at once instead of waiting.
    ended: str = ""
    cs_tls_ca: str = ""  # the CA certificate file the CS's TLS is verified with ("": plaintext)
    kind: str = "train"  # the phase's common.run_kinds.RunKind: what its input is called in errors

    @classmethod
    def nothing(cls, num_workers: int, why: str) -> "Rendezvous":
        return cls("", "", "", num_workers, 0, 0, (), 0, why)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Rendezvous":
        data = json.loads(text)
        data["inputs"] = tuple(InputSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in data["inputs"])
        return cls(**data)


RENDEZVOUS_DIR = "rendezvous"  # in the launcher's job folder; csrun_wse empties it per launch


def rendezvous_path(phase: str, job_id: str, job_dir: Path | None, model_dir: Path) -> Path:
    if job_dir is not None:
        return job_dir / RENDEZVOUS_DIR / f"{phase}.json"
    return model_dir / "cs_rendezvous" / job_id / f"{phase}.json"


def publish(path: Path, rendezvous: Rendezvous) -> None:
    """Write the rendezvous atomically, readable by this user only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(rendezvous.to_json())
    os.replace(tmp, path)


def wait_for(path: Path, timeout_s: float = 1800.0, poll_s: float = 0.02) -> Rendezvous:
    """The chief's rendezvous for this phase, once it is written (the chief compiles first)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise CSRunError(f"the chief did not publish {path} within {timeout_s:.0f} s",
                             "see the chief's log (task 0) in the job folder")
        time.sleep(poll_s)
    return Rendezvous.from_json(path.read_text())
