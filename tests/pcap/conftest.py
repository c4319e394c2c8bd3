"""One recording for the evidence tests: three clients at once, through a recording relay, under tcpdump."""

from __future__ import annotations

import pytest

from tests.pcap.recording import record
from tests.pcap.workload import CLIENTS


@pytest.fixture(scope="session")
def recorded(tmp_path_factory):
    info = record(tmp_path_factory.mktemp("pcap-recording"), CLIENTS, count=30)
    log = info["pcap"].with_suffix(".tcpdump.log").read_text()
    # The equality evidence needs every packet: a capture the kernel dropped packets from is no evidence.
    assert "\n0 packets dropped by kernel" in log, log
    assert all(n > 0 for n in info["consumed"].values()), info
    return info
