"""A Monitor that also counts what it took on to send, for the fault and load tests' "sent"
column. Imports no torch, so the load test's simulated ranks start in a blink."""

from __future__ import annotations

from trainer_plugin import Monitor


class CountingMonitor(Monitor):
    """Counts the GPU samples the sampler handed over and the buffer accepted: what the plugin
    took on to send."""

    gpu_rows_accepted = 0

    def add_gpu_rows(self, rows):
        rows = list(rows)
        if not self._accepting:
            return
        dropped_before = self._gpus_dropped
        super().add_gpu_rows(rows)
        self.gpu_rows_accepted += len(rows) - (self._gpus_dropped - dropped_before)
