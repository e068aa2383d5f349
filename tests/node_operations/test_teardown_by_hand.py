"""What a person removes by hand on a host the teardown could not reach comes from the wipe
script itself (`k3s_wipe.sh --by-hand`), so the two never disagree. Runs the real script
locally in its listing mode, which changes nothing."""

from __future__ import annotations

import re

from host_scripts import script_path
from node_operations.teardown import WipeOutcome


def test_by_hand_lists_every_path_the_wipe_removes() -> None:
    script = script_path("k3s_wipe.sh").read_text()
    block = re.search(r"WIPED_PATHS=\((?P<paths>[^)]*)\)", script)
    assert block is not None, "k3s_wipe.sh has no WIPED_PATHS list"
    paths = block["paths"].split()
    assert "/var/lib/rancher/k3s" in paths and "/etc/rancher/k3s" in paths
    report = WipeOutcome("w1", unreachable="connection refused").report()
    assert report.startswith("could not be reached (connection refused); remove by hand on it: ")
    for path in [*paths, "/usr/local/bin/k3s", "nft delete table inet hk3s_node"]:
        assert path in report, path


def test_a_wiped_host_reports_what_was_removed() -> None:
    assert WipeOutcome("w1", removed=("/run/k3s", "/var/lib/kubelet")).report() == "k3s wiped (2 paths removed)"
