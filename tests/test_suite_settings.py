"""The suite's own settings (tests/conftest.py): the real-pair tests are opt-in, the device setting is checked."""

from __future__ import annotations

from pathlib import Path

import conftest
import pytest


class _Item:
    def __init__(self, *keywords):
        self.keywords = dict.fromkeys(keywords, True)
        self.markers = []

    def add_marker(self, marker):
        self.markers.append(marker)


def test_real_pair_tests_run_only_when_asked(monkeypatch):
    """They fetch a 98 MB wheel and write a ~600 MB cache: skipped unless DIVERSED_REAL_PAIR=1 (.ci/run sets it)."""
    monkeypatch.delenv(conftest.REAL_PAIR_SETTING, raising=False)
    real, tiny = _Item("real_pair"), _Item()
    conftest.pytest_collection_modifyitems(None, [real, tiny])
    assert [marker.name for marker in real.markers] == ["skip"] and not tiny.markers
    assert "DIVERSED_REAL_PAIR=1" in real.markers[0].kwargs["reason"]
    monkeypatch.setenv(conftest.REAL_PAIR_SETTING, "1")
    asked = _Item("real_pair")
    conftest.pytest_collection_modifyitems(None, [asked])
    assert not asked.markers
    for name in ("test_real_pair.py", "test_tuned_pair.py"):  # their modules skip on import without the extra
        assert "\npytestmark = pytest.mark.real_pair" in (Path(__file__).parent / name).read_text()


def test_a_device_the_machine_cannot_use_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("DIVERSED_TEST_DEVICE", "no-such-device")
    with pytest.raises(pytest.UsageError, match="DIVERSED_TEST_DEVICE is 'no-such-device'"):
        conftest.pytest_configure(None)
