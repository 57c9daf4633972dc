"""What a model's params.yaml must hold, checked before any work starts: each section and
key with its type and range, each mistake one line naming the key and the file.

    SPEC = {"train_input": {"batch_size": Key("int", minimum=1)},
            "model": {"hidden_sizes": Key("ints", minimum=1), "dropout": Key("number", 0, below=1)}}
    check_params(params, SPEC, "configs/params.yaml")

An example declares the keys its input_fn and model_fn read (its model.py's `PARAMS_SPEC`)
and passes them to `launcher.run_flow.run`; keys not in the spec are left to the model,
except one that looks like a misspelling of a known key (`difflib`): it is refused naming
that key.

`ORIGINAL_SPEC` holds the keys the original installation's params.yaml files document
outside `runconfig` (whose keys `launcher.run_utils` holds): the model's own keys (read by
its input_fn / model_fn, as the original's models read them; their types are the model's
business), and the CS-1 settings that mean nothing here, each with the one line a run
prints when it is set (`check_original_keys`).
"""
from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping

from common.errors import CSRunError
from common.param_keys import Key

Spec = Mapping[str, Mapping[str, Key]]

_CS1_ONLY = "the simulated CS computes in float32"
_MODELS_OWN = Key("any", required=False)  # read by the model's own code, as the original's models read it
_INPUT_KEYS = {key: _MODELS_OWN for key in (
    "data_dir", "batch_size", "train_batch_size", "eval_batch_size", "shuffle", "shuffle_seed",
    "shuffle_buffer", "shuffle_buffer_size", "num_parallel_calls", "num_parallel_reads", "repeat",
    "use_multiple_workers", "mixed_precision", "data_processor")}
# The keys the original's params.yaml files document outside runconfig. Input, model and
# optimizer keys are read by the model's own input_fn / model_fn, as in the original (its
# models read `mixed_precision` for their Keras policy, its optimizer code the loss scaling
# and clipping keys); a `note` says what a CS-1 setting means here.
ORIGINAL_SPEC: dict[str, dict[str, Key]] = {
    "train_input": _INPUT_KEYS, "eval_input": _INPUT_KEYS, "predict_input": _INPUT_KEYS,
    "model": {
        "mixed_precision": _MODELS_OWN, "tf_summary": _MODELS_OWN,
        "boundary_casting": Key("any", required=False, note=(
            "the CS-1's float16 casts at kernel boundaries; " + _CS1_ONLY + ": not used")),
        "enable_gpu_optimizations": Key("any", required=False, note=(
            "GPU-specific layers in the original's models; csrun has no GPU path: not used")),
    },
    "optimizer": {key: _MODELS_OWN for key in (
        "optimizer_type", "learning_rate", "beta1", "beta2", "beta_1", "beta_2", "epsilon", "momentum",
        "weight_decay_rate", "loss_scaling_factor", "initial_loss_scale", "max_loss_scale",
        "steps_per_increase", "min_loss_scale", "overflow_tolerance",
        "max_gradient_norm", "grad_accum_steps", "log_summaries")},
    "csconfig": {
        "use_cbfloat16": Key("any", required=False, note=(
            "the CS-1's cbfloat16 (a 16-bit float with a wider exponent); " + _CS1_ONLY + ": not used")),
    },
}
OPEN_SECTIONS = {"csconfig": "a CS-1 compiler setting (CSConfig); csrun's compiler has no such setting: not used"}
SECTIONS = ("description", "runconfig", *ORIGINAL_SPEC)
_CLOSE = 0.85  # difflib ratio from which an unknown key is taken for a misspelling


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` looks like a misspelling of, if any."""
    found = difflib.get_close_matches(name, sorted(set(known)), n=1, cutoff=_CLOSE)
    return found[0] if found else None


def refuse_misspelling(where: str, name: str, known: Iterable[str], path: str) -> None:
    """A CSRunError when `name` (unknown in `where`) is close to a known name."""
    close = nearest(name, known)
    if close is not None:
        raise CSRunError(f"unknown {where} key {name!r} in {path}", f"did you mean {close!r}?")


def check_section(values: Any, keys: Mapping[str, Key], section: str, path: str) -> None:
    """Raise one CSRunError for the first key of `keys` that `values` (the section) lacks,
    or holds with a wrong type or out of range."""
    if not isinstance(values, dict):
        raise CSRunError(f"{section} in {path} is {values!r}, not a mapping",
                         f"write `{section}:` with its keys indented below it")
    for name, key in keys.items():
        if values.get(name) is None:
            if key.required:
                raise CSRunError(f"{section}.{name} is missing in {path}",
                                 f"set {name} to {key.describe()}")
            continue
        value = values[name]
        if not key.accepts(value):
            hint = f"fix {section}.{name} in {path}"
            if key.kind == "number" and isinstance(value, str) and _is_number(value):
                hint = f"YAML reads {value} as text: write it with a dot, e.g. 1.0e-3"
            raise CSRunError(f"{section}.{name} in {path} is {value!r}, not "
                             f"{key.describe()}", hint)


def check_original_keys(params: dict, path: str) -> list[str]:
    """Check the sections and keys of `ORIGINAL_SPEC` in `params` (a misspelt section name or
    key is refused, naming the known one); returns the notes of the keys set that mean nothing here, one line each."""
    for section in params:
        if section not in SECTIONS:
            refuse_misspelling("params section", section, SECTIONS, path)
    notes = []
    for section, keys in ORIGINAL_SPEC.items():
        if params.get(section) is None:
            continue
        check_section(params[section], keys, section, path)
        for name, value in params[section].items():
            if name not in keys:
                refuse_misspelling(section, name, keys, path)
            note = keys[name].note if name in keys else OPEN_SECTIONS.get(section, "")
            if note and value not in (None, False):
                notes.append(f"{section}.{name} = {value}: {note}")
    return notes


def check_params(params: dict, spec: Spec, path: str) -> None:
    """Raise one CSRunError for the first section or key of `spec` that `params` lacks or
    holds with a wrong type or out of range, or for a key of such a section that is not in
    `spec` (nor the original's) but looks like a misspelling of one that is."""
    for section, keys in spec.items():
        values = params.get(section)
        if values is None:
            if any(k.required for k in keys.values()):
                needed = ", ".join(k for k, key in keys.items() if key.required)
                raise CSRunError(f"{path} has no {section} section",
                                 f"add `{section}:` with {needed}")
            continue
        known = {*keys, *ORIGINAL_SPEC.get(section, {})}
        for name in values if isinstance(values, dict) else ():
            if name not in known:  # before "missing": a misspelt required key is named as such
                refuse_misspelling(section, name, known, path)
        check_section(values, keys, section, path)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
