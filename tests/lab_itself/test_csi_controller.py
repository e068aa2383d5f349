"""The Longhorn stand-in's CSI controller side (lab/longhorn_standin/csi_controller.py): the sizes and
names it takes from the real sidecars and Longhorn. Its behaviour against the real control plane and
kubelet is tests/lab/test_longhorn_csi.py."""

from __future__ import annotations

import pytest

from lab.longhorn_standin.csi_controller import ATTACHER_FINALIZER, aligned, parse_quantity


@pytest.mark.parametrize(
    ("text", "size"),
    [("16Mi", 16 << 20), ("1Gi", 1 << 30), ("1G", 10**9), ("500k", 500_000), ("4096", 4096)],
)
def test_a_claims_request_is_read_as_kubernetes_reads_it(text: str, size: int) -> None:
    assert parse_quantity(text) == size


def test_an_unsupported_quantity_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unsupported quantity '1\.5Gi'"):
        parse_quantity("1.5Gi")


def test_sizes_round_up_to_longhorns_2_mib_alignment() -> None:
    assert aligned(1) == 2 << 20
    assert aligned(16 << 20) == 16 << 20
    assert aligned((16 << 20) + 1) == 18 << 20


def test_the_attacher_finalizer_is_named_as_the_external_attacher_names_it() -> None:
    assert ATTACHER_FINALIZER == "external-attacher/driver-longhorn-io"
