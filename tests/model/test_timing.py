"""The load a measurement was taken under: what other processes took of the CPUs while it ran,
not the load average, which still counts the steps that built a minute before."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from optbuild.model.timing import busy_note, watch_load

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_this_process_own_work_is_not_competition():
    """Spinning a CPU for the whole window adds nothing to others_cpu (counted, it would add
    1/cpu_count) beyond what the host's other work took in a window just before."""
    with watch_load() as idle:
        time.sleep(0.5)
    with watch_load() as busy:
        spin(0.5)
    assert idle["others_cpu"] is not None
    assert busy["others_cpu"] < idle["others_cpu"] + 0.5 / busy["cpu_count"]


def test_another_process_spinning_beside_the_measurement_is_competition():
    code = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    hog = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.2)  # it has started
        with watch_load() as load:
            time.sleep(0.8)
    finally:
        hog.wait(10)
    # one CPU kept busy out of cpu_count, over the window (allow for scheduling slack)
    assert load["others_cpu"] >= 0.6 / load["cpu_count"]
    assert busy_note(load).startswith(f"other processes took {load['others_cpu']:.0%} of the "
                                      f"{load['cpu_count']} CPUs while measuring")


def test_the_note_falls_back_to_the_load_average_where_the_share_is_unknown():
    assert busy_note({"load_average": 4.15, "cpu_count": 2, "others_cpu": None}).startswith(
        "load average 4.15 on 2 CPUs as measuring began")
    assert busy_note({"load_average": 4.15, "cpu_count": 2, "others_cpu": 0.02}) is None  # it lags: the share rules
    assert busy_note({"load_average": 0.5, "cpu_count": 2}) is None
