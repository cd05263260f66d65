"""PCIe link peak bandwidth: the denominator of "PCIe TX/RX as % of link peak".

Peak per direction = transfer rate per lane (GT/s) × encoding efficiency × lane count / 8 bits per byte.
This is the line rate after encoding; real payload is lower still (TLP headers, flow control): the H200 moved
55.4 GB/s of payload over a Gen5 x16 link whose peak here is 63.0 GB/s, and NVML counts ~8 % more than payload
because it includes protocol bytes.
"""

from __future__ import annotations

from typing import Optional

# Transfer rate per lane, GT/s, by PCIe generation.
GT_PER_S_BY_GEN: dict[int, float] = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# Share of the line rate that carries data. Gen 1–2: 8b/10b. Gen 3–5: 128b/130b. Gen 6 uses PAM4 with
# 256-byte FLITs: 242 bytes of TLP + DLP per FLIT (the rest is CRC and FEC), so 242/256.
_ENCODING_BY_GEN: dict[int, float] = {1: 8 / 10, 2: 8 / 10, 3: 128 / 130, 4: 128 / 130, 5: 128 / 130, 6: 242 / 256}


def pcie_peak_bytes_per_s(gen: Optional[int], width: Optional[int]) -> Optional[float]:
    """Peak bytes/s in one direction of a link of PCIe generation ``gen`` and ``width`` lanes.

    ``None`` when either is unknown (``None``, 0, or a generation not in the table), so a missing peak shows
    as "unknown %", never as a division by zero.
    """
    if not gen or not width or width < 0 or gen not in GT_PER_S_BY_GEN:
        return None
    return GT_PER_S_BY_GEN[gen] * 1e9 * _ENCODING_BY_GEN[gen] * width / 8
