"""The wait bound of the transports (gtopk_hvd/transports/wait_bound.py), in one process; the
mpirun / horovodrun tests of a worker that never joins are in test_failures.py."""

from __future__ import annotations

import threading
import time

import pytest

from gtopk_hvd.transports.wait_bound import WaitBound, wait_timeout_from_environment


def test_a_wait_past_the_bound_calls_the_expiry_once_with_what_was_awaited() -> None:
    expired = threading.Event()
    messages: list[str] = []

    def on_expiry(message: str) -> None:
        messages.append(message)
        expired.set()

    bound = WaitBound(on_expiry, seconds=0.3)
    start = time.monotonic()
    with bound.waiting("the partner's set"):
        assert expired.wait(timeout=10)
    assert 0.3 <= time.monotonic() - start < 5
    assert len(messages) == 1 and "the partner's set" in messages[0], messages
    assert "waited more than 0.3 s" in messages[0] and "GTOPK_HVD_WAIT_TIMEOUT" in messages[0]


def test_waits_within_the_bound_never_expire() -> None:
    messages: list[str] = []
    bound = WaitBound(messages.append, seconds=0.5)
    for _ in range(30):  # 1.5 s of short waits, each well inside the bound
        with bound.waiting("a short wait"):
            time.sleep(0.05)
    time.sleep(1.2)  # idle between waits: nothing is awaited, nothing expires
    assert messages == []


def test_zero_disables_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTOPK_HVD_WAIT_TIMEOUT", "0")
    bound = WaitBound(lambda message: pytest.fail(message))
    assert bound.seconds == 0
    with bound.waiting("anything"):
        pass
    assert bound._thread is None  # no watcher started


@pytest.mark.parametrize(("text", "seconds"), [("", 600.0), ("2.5", 2.5), ("0", 0.0)])
def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, text: str,
                                              seconds: float) -> None:
    monkeypatch.setenv("GTOPK_HVD_WAIT_TIMEOUT", text)
    assert wait_timeout_from_environment() == seconds


@pytest.mark.parametrize("text", ["ten", "-1"])
def test_a_bad_bound_is_named(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("GTOPK_HVD_WAIT_TIMEOUT", text)
    with pytest.raises(ValueError, match="GTOPK_HVD_WAIT_TIMEOUT"):
        wait_timeout_from_environment()
