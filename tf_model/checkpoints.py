"""TensorFlow checkpoints in `model_dir`: one writer and one `checkpoint` index for every path.

`model.ckpt-N.{index,data-00000-of-00001}` are TF V2 checkpoints keyed by the graph's
variable names (optimizer slots `<var>/Adam`, `<var>/Adam_1`, `<var>/Momentum`,
`beta1_power`, `beta2_power`, and `global_step` as int64), so a `tf.compat.v1.train.Saver`
restores them and `tf.train.load_checkpoint` reads them. The CPU path and the CS chief both
write through `write_checkpoint`: the files go to a temporary prefix and are renamed into
place, and only then does the index (itself replaced atomically) name them, so a crash
never leaves a torn checkpoint as the newest. `keep_max` keeps the newest checkpoints and
deletes the files of the others.
"""
from __future__ import annotations

import glob
import os
import re
from typing import Any

import numpy as np
import tensorflow as tf

from common.errors import CSRunError
from tf_model.model_fn import op_error_text
from wafer.optimizers import OPTIMIZERS

INDEX = "checkpoint"
PREFIX = "model.ckpt"
_ENTRY = re.compile(r'^(model_checkpoint_path|all_model_checkpoint_paths):\s*"(.*)"\s*$')


def checkpoint_path(model_dir: str, step: int) -> str:
    return os.path.join(model_dir, f"{PREFIX}-{int(step)}")


def checkpoint_step(path: str) -> int:
    """N of `…/model.ckpt-N`."""
    return int(path.rsplit("-", 1)[1])


def _exists(path: str) -> bool:
    return os.path.exists(path + ".index")


def _read_index(model_dir: str) -> list[str] | None:
    """The checkpoints the index lists, oldest first (absolute prefixes); None when the
    index is missing, unreadable or names no checkpoint whose files exist (damaged)."""
    try:
        with open(os.path.join(model_dir, INDEX), errors="replace") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    paths, latest = [], None
    for line in lines:
        match = _ENTRY.match(line.strip())
        if not match:
            continue
        path = os.path.join(model_dir, match.group(2))  # absolute paths stay absolute
        if match.group(1) == "model_checkpoint_path":
            latest = path
        elif path not in paths:
            paths.append(path)
    if latest is not None and latest not in paths:
        paths.append(latest)
    return paths if any(_exists(p) for p in paths) else None


def _on_disk(model_dir: str) -> list[str]:
    """The checkpoints whose .index file is in model_dir, oldest first."""
    found = []
    for name in glob.glob(os.path.join(glob.escape(model_dir), f"{PREFIX}-*.index")):
        prefix = name[:-len(".index")]
        if re.fullmatch(r"\d+", prefix.rsplit("-", 1)[1]):
            found.append(prefix)
    return sorted(found, key=checkpoint_step)


def _listed(model_dir: str) -> list[str]:
    """The index's checkpoints; when the index is missing or damaged but checkpoint files
    are there, the index is rebuilt from the files (nothing restarts from scratch over them)."""
    paths = _read_index(model_dir)
    if paths is not None:
        return paths
    found = _on_disk(model_dir)
    if found:
        index = os.path.join(model_dir, INDEX)
        state = "damaged" if os.path.exists(index) else "missing"
        print(f"The checkpoint index {index} is {state}: rebuilt from the checkpoint files "
              f"({', '.join(os.path.basename(p) for p in found)})", flush=True)
        _write_index(model_dir, found)
    return found


def damage(path: str) -> str | None:
    """Why the checkpoint at `path` cannot be restored (its files read back with their
    checksums), or None when it is intact."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_dtype_map():
            reader.get_tensor(name)
    except Exception as error:  # any failure to read it back is damage (OpError, IndexError…)
        text = str(error).strip()
        return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
    return None


def _write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_index(model_dir: str, paths: list[str]) -> None:
    names = [os.path.relpath(p, model_dir) for p in paths]
    text = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{n}"\n' for n in names)
    _write_text_atomic(os.path.join(model_dir, INDEX), text)


def all_checkpoints(model_dir: str) -> list[str]:
    """The kept checkpoints whose files exist, oldest first."""
    return [p for p in _listed(model_dir) if _exists(p)]


def non_finite_loss(loss: float, step: int, model_dir: str) -> CSRunError:
    """The error that stops a run (CPU or CS) whose loss became NaN or infinite at `step`,
    naming the checkpoint to go back to, if there is one."""
    paths = all_checkpoints(model_dir)
    kept = (f"the newest checkpoint, {os.path.basename(paths[-1])}, is the last good one" if paths
            else "no checkpoint was written before it")
    return CSRunError(f"the loss became {loss} at step {step}",
                      f"check the input for NaN or infinite values, or lower the learning rate; {kept}")


DAMAGED = "damaged-"  # the name prefix of a damaged checkpoint's files, set aside by a training run


def latest_checkpoint(model_dir: str, set_aside: bool = False) -> str | None:
    """The newest intact checkpoint's prefix (`…/model.ckpt-N`), or None when there is
    none. A damaged newest one (truncated or corrupted files) is skipped, saying so, for
    the intact one before it; when every checkpoint is damaged the run is refused. With
    `set_aside` (a training run, holding the model_dir's lock) the damaged ones also leave
    the index and their files are renamed `damaged-model.ckpt-N.*`, kept for inspection:
    rotation then never drops an intact checkpoint for them."""
    paths = all_checkpoints(model_dir)
    damaged: list[tuple[str, str]] = []
    for path in reversed(paths):
        why = damage(path)
        if why is None:
            for bad, reason in damaged:
                aside = f": its files set aside as {DAMAGED}{os.path.basename(bad)}.*" if set_aside else ""
                print(f"Checkpoint {bad} is damaged ({reason}){aside}; using {os.path.basename(path)}",
                      flush=True)
            if set_aside and damaged:
                _set_aside(model_dir, [bad for bad, _ in damaged], paths)
            return path
        damaged.append((path, why))
    if damaged:
        bad, reason = damaged[0]
        raise CSRunError(f"every checkpoint in {model_dir} is damaged; the newest, {bad}: {reason}",
                         "restore the model.ckpt-* files from a copy, or move them out of the "
                         "model_dir to train from scratch")
    return None


def _set_aside(model_dir: str, damaged: list[str], listed: list[str]) -> None:
    """Take `damaged` out of the index, then rename their files with the DAMAGED prefix."""
    _write_index(model_dir, [p for p in listed if p not in damaged])
    for prefix in damaged:
        for name in glob.glob(glob.escape(prefix) + ".*"):
            os.replace(name, os.path.join(model_dir, DAMAGED + os.path.basename(name)))


def chosen_checkpoint(model_dir: str, checkpoint_path: str | None) -> str:
    """The checkpoint to evaluate or predict from: `checkpoint_path`, else the newest."""
    path = checkpoint_path or latest_checkpoint(model_dir)
    if path is None:
        raise CSRunError(f"no checkpoint in {model_dir} to evaluate", "train first (--mode train)")
    if not _exists(path):
        raise CSRunError(f"checkpoint {path} does not exist", "name a model.ckpt-N prefix")
    return path


def read_checkpoint(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint at `path`, by name (`global_step` included)."""
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.OpError, ValueError) as error:
        raise CSRunError(f"cannot read checkpoint {path}: {str(error).splitlines()[0]}",
                         "name a model.ckpt-N prefix whose .index and .data files exist") from None
    return {name: np.asarray(reader.get_tensor(name))
            for name in reader.get_variable_to_dtype_map()}


def _save_v2(prefix: str, tensors: dict[str, np.ndarray]) -> None:
    """Write `tensors` as one TF V2 checkpoint at `prefix` (SaveV2 in a graph of its own)."""
    names = sorted(tensors)
    graph = tf.Graph()
    with graph.as_default():
        feeds = {n: tf.compat.v1.placeholder(tf.as_dtype(np.asarray(tensors[n]).dtype),
                                             np.shape(tensors[n])) for n in names}
        path = tf.compat.v1.placeholder(tf.string, [])
        save = tf.raw_ops.SaveV2(prefix=path, tensor_names=names, shape_and_slices=[""] * len(names),
                                 tensors=[feeds[n] for n in names])
    with tf.compat.v1.Session(graph=graph) as session:
        feed: dict[Any, Any] = {feeds[n]: np.asarray(tensors[n]) for n in names}
        feed[path] = prefix
        session.run(save, feed)


def write_checkpoint(model_dir: str, step: int, tensors: dict[str, np.ndarray],
                     keep_max: int | None) -> str:
    """Write `model_dir/model.ckpt-<step>` holding exactly `tensors`, list it in the index
    as the newest and keep the newest `keep_max` (None or 0: all). Returns the prefix."""
    os.makedirs(model_dir, exist_ok=True)
    final = checkpoint_path(model_dir, step)
    tmp = os.path.join(model_dir, f".{PREFIX}-{int(step)}.tmp-{os.getpid()}")
    try:
        _save_v2(tmp, tensors)
    except tf.errors.OpError as error:
        for leftover in glob.glob(glob.escape(tmp) + "*"):
            os.remove(leftover)
        size = sum(np.asarray(t).nbytes for t in tensors.values())
        if "No space left on device" in (error.message or ""):
            raise CSRunError(f"no space left on the device of {model_dir} to write checkpoint {step} "
                             f"(it needs about {size / 1e6:,.1f} MB)",
                             "free space there, or train into another model_dir; the checkpoints "
                             "before it are intact") from None
        raise CSRunError(f"cannot write checkpoint {step} into {model_dir}: {op_error_text(error)}") from None
    earlier = [p for p in all_checkpoints(model_dir) if p != final]  # before the new files show
    for written in sorted(glob.glob(glob.escape(tmp) + ".*"), key=lambda p: p.endswith(".index")):
        os.replace(written, final + written[len(tmp):])  # data first, the index last
    kept = earlier + [final]
    dropped = kept[:-keep_max] if keep_max else []
    kept = kept[len(dropped):]
    _write_index(model_dir, kept)
    for old in dropped:
        for name in glob.glob(glob.escape(old) + ".*"):
            os.remove(name)
    return final


_RNG_STATE = re.compile(r"(^|/)seed_generator(_\d+)?/seed_generator_state$")
_SLOT = re.compile(r"/(AdamW|Adam|Momentum|RMSProp|ProximalAdagrad|Adagrad|Adadelta|Ftrl)(_\d+)?$")
OPTIMIZER_SCALARS = tuple(dict.fromkeys(name for rule in OPTIMIZERS.values()
                                        for name in rule.scalar_names))  # Adam's beta powers
# (a second AdamOptimizer's are beta1_power_1, beta2_power_1)
_SCALAR = re.compile("^(" + "|".join(map(re.escape, OPTIMIZER_SCALARS)) + r")(_\d+)?$")


def is_optimizer_scalar(name: str) -> bool:
    """Adam's beta powers, a second Adam's among them."""
    return bool(_SCALAR.match(name))


def is_optimizer_state(name: str) -> bool:
    """An optimizer slot (`<var>/Adam`, `<var>/Momentum`…) or Adam's beta powers."""
    return is_optimizer_scalar(name) or bool(_SLOT.search(name))


def optimizer_of(names) -> str:
    """The optimizers whose state these variable names hold ("" for none: plain SGD)."""
    found = {m.group(1) for n in names if (m := _SLOT.search(n))}
    found |= {"Adam"} if any(is_optimizer_scalar(n) for n in names) and "AdamW" not in found \
        else set()
    return ", ".join(sorted(found))


def optimizer_changed(path: str, stored, optimizer: str) -> bool:
    """Whether the checkpoint at `path` (variable names `stored`) holds the state of
    another optimizer than `optimizer` (`optimizer_of`'s names). A change is not an error
    on either path: the weights and the global step resume, the new optimizer's state
    starts as it starts in a new run, and one line says so."""
    before = optimizer_of(stored)
    if before == optimizer:
        return False
    print(f"Checkpoint {path} holds {before or 'no'} optimizer state and this model trains "
          f"with {optimizer or 'plain gradient descent'}: resuming its weights and global "
          "step, the optimizer state starts fresh", flush=True)
    return True


def check_shapes(path: str, model: dict[str, tuple[int, ...]], stored: dict[str, Any]) -> None:
    """The model's variables (name → shape) must have the shapes the checkpoint at `path`
    stored (name → shape): else it was trained with another model, say so."""
    wrong = [f"{name} {tuple(stored[name])} there, {shape} in the model" for name, shape in model.items()
             if name in stored and tuple(stored[name]) != shape]
    if wrong:
        raise CSRunError(f"the checkpoint {path} was trained with other shapes: {', '.join(wrong[:3])}"
                         f"{' …' if len(wrong) > 3 else ''}",
                         "use a new model_dir for a changed model (or change the model back)")


def restore_variables(session: tf.compat.v1.Session, variables: list, path: str) -> None:
    """Restore `variables` (of the session's graph) from the checkpoint at `path` with a
    Saver; every one must be in it with its shape."""
    stored = dict(tf.train.list_variables(path))
    # Keras's dropout RNG state is not model state: a CS checkpoint has none, it stays as set up
    variables = [v for v in variables if v.op.name in stored or not _RNG_STATE.search(v.op.name)]
    missing = [v.op.name for v in variables if v.op.name not in stored]
    if missing:
        raise CSRunError(f"checkpoint {path} has no {', '.join(missing[:5])}"
                         f"{' …' if len(missing) > 5 else ''}: it was written by another model",
                         "use a new model_dir for a changed model")
    check_shapes(path, {v.op.name: tuple(v.shape.as_list()) for v in variables}, stored)
    with session.graph.as_default():
        tf.compat.v1.train.Saver(var_list={v.op.name: v for v in variables}).restore(session, path)
