"""The lab's kubectl (``lab/build/kube.sh``), as `k3s kubectl` runs it on every lab server.

kube.sh builds it from a copy of k8s.io/kubectl whose ``i18n.LoadTranslations`` stores the
language's translation files in its in-memory zip instead of deflating them at every start (the
lab starts kubectl thousands of times a run). The translations must still load and read back:
kubectl's help in German and in Japanese, from the files of its own release. Needs kubectl in
``$HK3S_LAB_CACHE/bin`` (default /var/cache/hk3s-lab/bin); skips only when it is absent.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from lab.stack_harness import BIN, skip_without_lab_binaries

pytestmark = pytest.mark.lab

KUBECTL = BIN / "kubectl"
# From k8s.io/kubectl's pkg/util/i18n/translations/kubectl/<lang>/LC_MESSAGES/k8s.po: the
# translations of "Display one or many resources" and "Run a particular image on the cluster".
GERMAN = "Zeige eine oder mehrere Resourcen"
JAPANESE = "クラスタ上で特定のイメージを起動する"


def _help(language: str) -> str:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LC_")}
    env["LANG"] = language
    return subprocess.run([str(KUBECTL), "--help"], env=env, capture_output=True, text=True, check=True).stdout


def test_kubectl_built_with_stored_translations_still_speaks_every_language() -> None:
    skip_without_lab_binaries("kubectl")
    built = subprocess.run(["go", "version", "-m", str(KUBECTL)], capture_output=True, text=True, check=True).stdout
    # `go version -m`: "dep k8s.io/kubectl v0.0.0" then "=> ./kubectl-stored (devel)".
    assert re.search(r"\bk8s\.io/kubectl\s+\S+\s+=>\s+\./kubectl-stored\s", built), (
        f"kubectl was not built from kube.sh's copy of k8s.io/kubectl:\n{built}"
    )
    english = _help("en_US.UTF-8")
    assert "Display one or many resources" in english and GERMAN not in english
    assert GERMAN in _help("de_DE.UTF-8")
    assert JAPANESE in _help("ja_JP.UTF-8")
