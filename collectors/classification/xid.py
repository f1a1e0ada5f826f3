"""NVIDIA XID codes → root-cause category, as data.

Source: NVIDIA's XID catalogue, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html) and, for 48/63/64, "Dynamic
Page Retirement — Visibility" (https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html).

Each entry is (category, mnemonic, description). ``category`` is None for XIDs that are informational
or only a consequence of an earlier XID (e.g. 45 "preemptive cleanup, due to previous errors"): they
are kept as evidence but never decide a verdict. Application-caused faults (13, 31, 43, 69) map to
``software_bug``; ECC/row-remap/page-retirement events to ``gpu_memory``; bus, NVLink, GSP and
firmware failures to ``gpu_hardware``. Which XID category wins over text evidence is decided by the
``xid``-field rules of the rule file, not here.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class XidInfo(NamedTuple):
    category: str | None
    mnemonic: str
    description: str


XID_CATALOGUE: dict[int, XidInfo] = {
    8: XidInfo("software_bug", "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing"),
    13: XidInfo("software_bug", "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics engine exception"),
    31: XidInfo("software_bug", "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault"),
    32: XidInfo("gpu_hardware", "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Invalid or corrupted push buffer stream"),
    38: XidInfo("gpu_hardware", "DRIVER_FIRMWARE_ERROR", "Driver firmware error"),
    43: XidInfo("software_bug", "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing"),
    45: XidInfo(None, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors"),
    48: XidInfo("gpu_memory", "DBE", "Double bit ECC error"),
    54: XidInfo("gpu_hardware", "AUX_POWER_NOT_CONNECTED", "Auxiliary power is not connected"),
    61: XidInfo("gpu_hardware", "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning"),
    62: XidInfo("gpu_hardware", "PMU_HALT_ERROR", "Internal micro-controller halt"),
    63: XidInfo("gpu_memory", "ECC_PAGE_RETIREMENT_OR_ROW_REMAPPING_EVENT",
                "ECC page retirement or row remapping recording event"),
    64: XidInfo("gpu_memory", "ECC_PAGE_RETIREMENT_OR_ROW_REMAPPER_FAILURE",
                "ECC page retirement or row remapper recording failure"),
    69: XidInfo("software_bug", "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error"),
    74: XidInfo("gpu_hardware", "NVLINK_ERROR", "NVLink error"),
    79: XidInfo("gpu_hardware", "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus"),
    92: XidInfo(None, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate"),
    94: XidInfo("gpu_memory", "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained ECC error"),
    95: XidInfo("gpu_memory", "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained ECC error"),
    119: XidInfo("gpu_hardware", "GSP_RPC_TIMEOUT", "GSP RPC timeout"),
    120: XidInfo("gpu_hardware", "GSP_ERROR", "GSP error"),
    121: XidInfo(None, "C2C_LINK_CORRECTED_ERROR", "C2C link corrected error"),
    122: XidInfo("gpu_hardware", "SPI_PMU_RPC_READ_FAIL", "SPI PMU RPC read failure"),
    123: XidInfo("gpu_hardware", "SPI_PMU_RPC_WRITE_FAIL", "SPI PMU RPC write failure"),
    124: XidInfo("gpu_hardware", "SPI_PMU_RPC_ERASE_FAIL", "SPI PMU RPC erase failure"),
    140: XidInfo("gpu_memory", "ECC_UNRECOVERABLE_ERROR", "Unrecovered ECC error"),
    143: XidInfo("gpu_hardware", "GPU_INIT_FAILURE", "GPU initialization failure"),
    144: XidInfo("gpu_hardware", "NVLINK_SAW_ERROR", "NVLink SAW error"),
    145: XidInfo("gpu_hardware", "NVLINK_RLW_ERROR", "NVLink RLW error"),
    146: XidInfo("gpu_hardware", "NVLINK_TLW_ERROR", "NVLink TLW error"),
    147: XidInfo("gpu_hardware", "NVLINK_TREX_ERROR", "NVLink TREX error"),
    148: XidInfo("gpu_hardware", "NVLINK_NVLPW_CTRL_ERROR", "NVLink NVLPW control error"),
    149: XidInfo("gpu_hardware", "NVLINK_NETIR_ERROR", "NVLink NETIR error"),
    150: XidInfo("gpu_hardware", "NVLINK_MSE_ERROR", "NVLink MSE error"),
    154: XidInfo(None, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed"),
}

# The kernel log line: "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus." (also the
# older "NVRM: Xid (0000:01:00): 13, ..." and NVML/DCGM summaries like "Xid 79" / "XID 48").
_XID_IN_TEXT = re.compile(r"\bXid\s*(?:\([^)]*\))?\s*:?\s*(\d{1,3})\b", re.IGNORECASE)


def lookup(code: int) -> XidInfo | None:
    return XID_CATALOGUE.get(code)


def category_of(code: int) -> str | None:
    info = XID_CATALOGUE.get(code)
    return info.category if info else None


def xids_in_text(text: str) -> list[int]:
    """XID codes named in a log excerpt, in order of first appearance."""
    found: list[int] = []
    for match in _XID_IN_TEXT.finditer(text or ""):
        code = int(match.group(1))
        if code not in found:
            found.append(code)
    return found
