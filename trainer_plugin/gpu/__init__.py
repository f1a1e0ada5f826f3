"""GPU telemetry: a sampler thread that reads every GPU of the host through NVML (or a simulated
sensor, marked as such in the data) and hands rows and XID/ECC events to the Monitor.

Importing this package imports neither NVML nor torch; ``pynvml`` is imported when a real sensor
opens.
"""

from __future__ import annotations

from trainer_plugin.gpu.nvml import NO_GPU, NvmlSensor
from trainer_plugin.gpu.sampler import GpuSampler
from trainer_plugin.gpu.simulated import SimulatedSensor

__all__ = ["NO_GPU", "GpuSampler", "NvmlSensor", "SimulatedSensor"]
