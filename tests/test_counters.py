from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpuledger.collector.counters import RateTracker
from gpuledger.collector.dcgm_source import DcgmPageConverter


def test_rates_resets_and_gaps():
    rates = RateTracker(interval_s=10)
    assert rates.rate("k", 100.0, 1000.0) is None  # first reading
    assert rates.rate("k", 110.0, 2000.0) == pytest.approx(100.0)
    assert rates.rate("k", 120.0, 50.0) is None and rates.resets == 1  # went down: reset, not negative
    assert rates.rate("k", 130.0, 150.0) == pytest.approx(10.0)  # counting resumes from the reset value
    assert rates.rate("k", 175.0, 9999.0) is None and rates.gaps == 1  # 45 s > 3 intervals: no rate
    assert rates.rate("k", 175.0, 10000.0) is None  # no time elapsed
    assert rates.rate("other", 175.0, 1.0) is None  # keys are independent


def test_dcgm_energy_counter_becomes_average_power():
    t0 = datetime(2026, 11, 30, tzinfo=timezone.utc)
    line = 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0",UUID="GPU-e",modelName="NVIDIA L4",Hostname="n"}} {}\n'
    conv = DcgmPageConverter()
    assert conv.convert(line.format(1_000_000), t0, 30).to_pylist()[0]["power_avg_w"] is None
    second = conv.convert(line.format(1_000_000 + 30 * 70_000), t0 + timedelta(seconds=30), 30)
    assert second.to_pylist()[0]["power_avg_w"] == pytest.approx(70.0)
    reset = conv.convert(line.format(5), t0 + timedelta(seconds=60), 30)
    assert reset.to_pylist()[0]["power_avg_w"] is None
