"""The project's packages in layers, bottom first: a module imports only from its own package
or from a lower layer (`tests/common/test_layers.py` checks every import). docs/design.md says what
each layer holds and why."""
from __future__ import annotations

import os

LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),                                   # errors, run kinds
    ("cs_api",),                                   # the CS API contract and its client
    ("wafer",),                                    # kernels, training rules, fabric, timing
    ("tf_model",),                                 # the model on TensorFlow, the CPU path
    ("wse_sim", "workers", "slurm", "containers"),  # simulator, input workers, launch, images
    ("coordinator",),                              # the chief node: compiler and chief
    ("launcher",),                                 # the CLIs and the user API
)
PACKAGES: tuple[str, ...] = tuple(name for layer in LAYERS for name in layer)
ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def layer_of(module: str) -> int | None:
    """The layer of a dotted module name, None for modules outside the project."""
    top = module.split(".")[0]
    for index, layer in enumerate(LAYERS):
        if top in layer:
            return index
    return None


def package_dirs() -> tuple[str, ...]:
    """Each project package's directory (with a trailing separator)."""
    return tuple(os.path.join(ROOT, name) + os.sep for name in PACKAGES)
