"""Fabric parameters of the CS systems (docs/design.md, "Fabric and timing model")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fabric:
    """One wafer: a grid of cores, each with its SRAM, linked to its four neighbours."""

    name: str
    width: int  # cores along x
    height: int  # cores along y
    sram_per_core: int  # bytes
    clock_hz: float
    flops_per_cycle: float  # per core (fp16 estimate)
    efficiency: float  # eta: fraction of peak a kernel sustains (see MIN_FLOPS_PER_CORE)
    io_bytes_per_sec: float  # 12 x 100 GbE
    link_bytes_per_cycle: float = 4.0  # one 32-bit word per cycle per direction

    @property
    def cores(self) -> int:
        return self.width * self.height

    @property
    def core_flops_per_sec(self) -> float:
        return self.flops_per_cycle * self.clock_hz * self.efficiency

    @property
    def sram_bytes(self) -> int:
        return self.cores * self.sram_per_core


FABRICS: dict[str, Fabric] = {
    "cs1": Fabric("cs1", 633, 633, 48 * 1024, 0.9e9, 8.0, 0.5, 12 * 100e9 / 8),
    "cs2": Fabric("cs2", 757, 996, 48 * 1024, 1.1e9, 8.0, 0.5, 12 * 100e9 / 8),
}
DEFAULT_FABRIC = "cs1"  # a run's fabric when its runconfig names none; `wse_sim serve`'s default


def get_fabric(name: str) -> Fabric:
    try:
        return FABRICS[name]
    except KeyError:
        raise ValueError(f"unknown fabric {name!r}; choose one of {', '.join(FABRICS)}") from None
