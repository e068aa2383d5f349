"""CopiesOffer's check without a cluster: it reads Longhorn's volumes only when the offer goes down
(the lab test tests/lab/test_longhorn_copies.py shows the refusal against Longhorn's objects)."""

from __future__ import annotations

from providers.copies_offer import CopiesOfferProvider, refusal

LOGIN = {"node": "srv", "address": "192.0.2.1", "ssh_port": 22, "ssh_user": "root", "private_key": "k"}


def test_raising_or_keeping_the_offer_reads_nothing() -> None:
    provider = CopiesOfferProvider()
    # 192.0.2.1 answers nothing: a read would fail the check.
    assert provider.check({**LOGIN, "max_copies": 1.0}, {**LOGIN, "max_copies": 2.0}).failures == []
    assert provider.check({**LOGIN, "max_copies": 2.0}, {**LOGIN, "max_copies": 2.0}).failures == []
    assert provider.check({}, {**LOGIN, "max_copies": 1.0}).failures == []


def test_the_refusal_names_the_setting_and_every_volume() -> None:
    text = refusal(1, {"pvc-b": 2, "pvc-a": 2})
    assert text.startswith("hk3s:storage.max_copies cannot go down to 1 while Longhorn volumes keep more copies:")
    assert "pvc-a (2 copies), pvc-b (2 copies)" in text and "Nothing was changed" in text
