"""The install's container step classifies a refused trial container by cause, whichever OCI
runtime words it (scripts/oci-failure.sh), so a fresh machine gets its containers.conf drop-in
from runc's wording as from crun's. The wordings are captured messages
(tests/fixtures/install/, sources in its SOURCES.md).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "install"
CLASSIFIER = ROOT / "scripts" / "oci-failure.sh"

EXPECTED = {
    "runc-rlimit-podman4.3.txt": "rlimit",
    "runc-rlimit-podman4.2.txt": "rlimit",
    "crun-setrlimit-nofile.txt": "rlimit",
    "crun-setrlimit-nproc.txt": "rlimit",
    "crun-hybrid-cgroups.txt": "hybrid-cgroups",
    "crun-open-executable.txt": "other",
    "runc-no-executable.txt": "other",
}


def cause(text: str) -> str:
    proc = subprocess.run(
        ["bash", "-c", '. "$0"; oci_failure_cause "$1"', str(CLASSIFIER), text],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def test_every_fixture_has_an_expectation_and_a_source() -> None:
    files = {p.name for p in FIXTURES.glob("*.txt")}
    assert files == set(EXPECTED)
    sources = (FIXTURES / "SOURCES.md").read_text()
    for name in files:
        assert name in sources, f"{name} has no source in SOURCES.md"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_wording_is_classified_by_cause(name: str) -> None:
    assert cause((FIXTURES / name).read_text()) == EXPECTED[name]


def test_the_wording_that_broke_fresh_installs_is_not_mistaken_for_something_else() -> None:
    # runc says "setting rlimit" (a space), which the old pattern `*setrlimit*` missed.
    text = (FIXTURES / "runc-rlimit-podman4.3.txt").read_text()
    assert "setrlimit" not in text.lower()
    assert cause(text) == "rlimit"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Error: short-name resolution enforced",
        "rlimit mentioned in passing, nothing refused",  # no refusal: not ours to fix
        "Error: crun: setrlimit `RLIMIT_NOFILE`: Invalid argument",
    ],
)
def test_other_failures_are_not_papered_over(text: str) -> None:
    assert cause(text) == "other"


def test_container_image_script_uses_the_classifier() -> None:
    script = (ROOT / "scripts" / "container-image.sh").read_text()
    assert "oci-failure.sh" in script
    assert 'oci_failure_cause "$out"' in script
