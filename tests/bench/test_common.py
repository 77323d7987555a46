"""bench.common: the benchmarks post each named frame in the raw format the service reads as the
in-process pipeline reads it (its sensor's intensity convention, its columns)."""

from __future__ import annotations

import pytest

from app.codecs import binary
from bench import common


@pytest.mark.parametrize("name", sorted(common.FRAMES))
def test_each_frame_posts_in_the_raw_format_of_its_sensor(name):
    rel, columns = common.FRAMES[name]
    sensor = common.sensor_of(name)
    assert binary.LAYOUTS[sensor] == (columns, sensor)
    assert common.sensor_of(f"/frames/{rel}") == sensor  # the same frame given by its path
