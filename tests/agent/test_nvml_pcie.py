"""PCIe peak per direction from max link generation and width."""

import pytest

from trimtab.agent.pcie import pcie_peak_bytes_per_s


@pytest.mark.parametrize("gen, width, gb_per_s", [
    (1, 16, 4.0),       # 2.5 GT/s × 8/10
    (2, 16, 8.0),
    (3, 16, 15.75),     # 8 GT/s × 128/130
    (4, 16, 31.51),
    (5, 16, 63.02),
    (5, 8, 31.51),
    (6, 16, 121.0),     # 64 GT/s × 242/256 (FLIT)
])
def test_peak_per_direction(gen, width, gb_per_s):
    assert pcie_peak_bytes_per_s(gen, width) / 1e9 == pytest.approx(gb_per_s, rel=1e-3)


@pytest.mark.parametrize("gen, width", [(None, 16), (5, None), (0, 16), (5, 0), (7, 16)])
def test_unknown_link_has_no_peak(gen, width):
    assert pcie_peak_bytes_per_s(gen, width) is None
