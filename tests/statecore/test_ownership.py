"""Tests for statecore.ownership: the liveness rule, its cache, PsutilProbe and Incarnation."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import attrs
import psutil
import pytest

from statecore.ownership import (
    Incarnation,
    LivenessCache,
    ProcessProbe,
    PsutilProbe,
    host_identity,
    owner_alive,
)

CHILD_TIMEOUT = 10.0
"""Real seconds a child process may take to start, die or be reaped before a test fails."""


def kernel_start_ticks(pid: int) -> int:
    """The kernel's start time of ``pid`` in clock ticks since boot, derived through psutil."""
    created = psutil.Process(pid).create_time()
    return round((created - psutil.boot_time()) * os.sysconf("SC_CLK_TCK"))


def test_start_time_ignores_wall_clock_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall-clock step (it shifts psutil's boot time) leaves a live owner's start time as is."""
    probe = PsutilProbe()
    before = probe.start_time(os.getpid())
    platform_module = getattr(psutil, "_pslinux", None)
    if platform_module is None:
        pytest.skip("the kernel's boot-relative start time is read on Linux only")
    real_boot_time = platform_module.boot_time
    monkeypatch.setattr(platform_module, "boot_time", lambda: real_boot_time() + 3600.0)
    assert probe.start_time(os.getpid()) == before
    assert owner_alive(os.getpid(), before, probe)


class FakeProbe:
    """A scripted ProcessProbe: ``procs`` maps a live pid to its start time (None: unreadable)."""

    def __init__(
        self,
        procs: dict[int, int | None] | None = None,
        *,
        raise_in: str | None = None,
    ) -> None:
        self.procs = dict(procs or {})
        self.raise_in = raise_in
        self.calls: list[tuple[str, int]] = []

    def pid_exists(self, pid: int) -> bool:
        self.calls.append(("pid_exists", pid))
        if self.raise_in == "pid_exists":
            raise RuntimeError("probe broke in pid_exists")
        return pid in self.procs

    def start_time(self, pid: int) -> int | None:
        self.calls.append(("start_time", pid))
        if self.raise_in == "start_time":
            raise RuntimeError("probe broke in start_time")
        return self.procs.get(pid)


def _gone_pid() -> int:
    """A pid that belonged to a process which has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=CHILD_TIMEOUT)
    assert not psutil.pid_exists(child.pid), "pid was reused at once; rerun"
    return child.pid


@pytest.fixture
def sleeper_child() -> Iterator[subprocess.Popen[bytes]]:
    """A real child process that sleeps; killed and reaped whatever the test does."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        if child.returncode is None:
            child.kill()
            child.wait(timeout=CHILD_TIMEOUT)


def _wait_for_zombie(pid: int) -> None:
    """Poll psutil (bounded) until ``pid`` is an unreaped zombie."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.01)
    pytest.fail(f"pid {pid} did not become a zombie within {CHILD_TIMEOUT}s")


# -- the liveness rule, through a probe we own -------------------------------------------------


def test_fake_probe_is_a_process_probe() -> None:
    """The test's FakeProbe and PsutilProbe satisfy the runtime-checkable ProcessProbe protocol."""
    assert isinstance(FakeProbe(), ProcessProbe)
    assert isinstance(PsutilProbe(), ProcessProbe)


def test_owner_dead_when_pid_gone() -> None:
    """A recorded pid that no longer exists is dead."""
    probe = FakeProbe({})
    assert owner_alive(4242, 1000, probe) is False


def test_owner_dead_when_start_time_differs() -> None:
    """A pid now held by a process with another start time (pid reuse) is dead."""
    probe = FakeProbe({4242: 2000})
    assert owner_alive(4242, 1000, probe) is False


def test_owner_alive_when_start_time_matches() -> None:
    """A pid whose current start time equals the recorded one is alive."""
    probe = FakeProbe({4242: 1000})
    assert owner_alive(4242, 1000, probe) is True


@pytest.mark.parametrize("exists", [True, False])
def test_unreadable_current_start_time_falls_back_to_pid_exists(exists: bool) -> None:
    """When the probe cannot read the pid's start time, the answer is pid_exists()."""
    probe = FakeProbe({4242: None} if exists else {})
    assert owner_alive(4242, 1000, probe) is exists
    assert ("pid_exists", 4242) in probe.calls


@pytest.mark.parametrize("exists", [True, False])
def test_unrecorded_start_time_falls_back_to_pid_exists(exists: bool) -> None:
    """When no start time was recorded for the owner, the answer is pid_exists()."""
    probe = FakeProbe({4242: 1000} if exists else {})
    assert owner_alive(4242, None, probe) is exists
    assert ("pid_exists", 4242) in probe.calls


@pytest.mark.parametrize(
    ("procs", "raise_in"),
    [
        ({4242: 1000}, "start_time"),
        ({4242: None}, "pid_exists"),
    ],
    ids=["start_time-raises", "pid_exists-raises"],
)
def test_raising_probe_means_dead_and_never_escapes(
    procs: dict[int, int | None], raise_in: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A probe that raises makes the owner dead; owner_alive() swallows it and logs a warning."""
    probe = FakeProbe(procs, raise_in=raise_in)
    with caplog.at_level(logging.WARNING, logger="statecore.ownership"):
        assert owner_alive(4242, 1000, probe) is False
    assert any("4242" in record.getMessage() for record in caplog.records)


def test_raising_pid_exists_with_unrecorded_start_time_is_dead() -> None:
    """pid_exists() raising when the recorded start time is None also means dead."""
    probe = FakeProbe({4242: 1000}, raise_in="pid_exists")
    assert owner_alive(4242, None, probe) is False


@pytest.mark.parametrize("pid", [None, 0, -1, -4242, True, False])
def test_invalid_pid_is_dead_without_probing(pid: int | None) -> None:
    """No pid, pid 0, a negative pid or a bool pid is dead and the probe is never asked."""
    probe = FakeProbe({0: 1000, 1: 1000})
    assert owner_alive(pid, 1000, probe) is False
    assert owner_alive(pid, None, probe) is False
    assert probe.calls == []


def test_owner_alive_never_sends_a_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """owner_alive() with PsutilProbe never calls os.kill (signal 0 is Ctrl+C on Windows)."""
    me = os.getpid()
    started = PsutilProbe().start_time(me)
    gone = _gone_pid()
    signals: list[tuple[object, ...]] = []

    def no_signals(*args: object) -> None:
        signals.append(args)
        raise AssertionError(f"os.kill{args} called while probing liveness")

    monkeypatch.setattr(os, "kill", no_signals)
    monkeypatch.setattr(os, "killpg", no_signals)
    probe = PsutilProbe()
    # owner_alive swallows exceptions, so the recorded calls are what this test checks.
    assert owner_alive(me, started, probe) is True
    assert owner_alive(me, None, probe) is True
    assert owner_alive(me, (started or 0) + 1, probe) is False
    assert owner_alive(gone, 1000, probe) is False
    assert owner_alive(gone, None, probe) is False
    assert LivenessCache(probe).alive(me, started) is True
    assert signals == []


# -- LivenessCache ------------------------------------------------------------------------------


def test_liveness_cache_probes_each_owner_once() -> None:
    """A sweep over many rows of few owners probes each distinct (pid, started_at) once."""
    probe = FakeProbe({10: 100, 20: 200, 30: None})
    cache = LivenessCache(probe)
    owners = [(10, 100), (20, 999), (30, 300), (40, 400)]  # alive, reused, unreadable, gone
    rows = [owners[i % len(owners)] for i in range(200)]

    answers = [cache.alive(pid, started) for pid, started in rows]

    assert cache.probes == 4
    assert answers[:4] == [True, False, True, False]
    assert answers == answers[:4] * 50
    assert sum(1 for name, _ in probe.calls if name == "start_time") == 4
    # Only the owners whose start time could not be read needed pid_exists.
    assert sorted(pid for name, pid in probe.calls if name == "pid_exists") == [30, 40]


def test_liveness_cache_keys_on_start_time_too() -> None:
    """The same pid with two recorded start times is two owners, each probed once."""
    probe = FakeProbe({10: 100})
    cache = LivenessCache(probe)
    assert cache.alive(10, 100) is True
    assert cache.alive(10, 50) is False
    assert cache.alive(10, 100) is True
    assert cache.alive(10, 50) is False
    assert cache.probes == 2


def test_liveness_cache_does_not_refresh() -> None:
    """A cache keeps its first answer even if the owner dies later (one cache per sweep)."""
    probe = FakeProbe({10: 100})
    cache = LivenessCache(probe)
    assert cache.alive(10, 100) is True
    del probe.procs[10]
    assert cache.alive(10, 100) is True
    assert LivenessCache(probe).alive(10, 100) is False


def test_liveness_cache_answers_match_owner_alive() -> None:
    """LivenessCache.alive() gives the same verdict as owner_alive() for every kind of owner."""
    owners = [(10, 100), (10, 1), (20, None), (30, 5), (None, 5), (0, None), (-3, 1)]
    probe = FakeProbe({10: 100, 20: 7})
    cache = LivenessCache(probe)
    for pid, started in owners:
        assert cache.alive(pid, started) is owner_alive(pid, started, probe)


def test_liveness_cache_swallows_raising_probe() -> None:
    """A raising probe seen through LivenessCache is a cached 'dead' verdict, not an exception."""
    probe = FakeProbe({10: 100}, raise_in="start_time")
    cache = LivenessCache(probe)
    assert cache.alive(10, 100) is False
    assert cache.alive(10, 100) is False
    assert cache.probes == 1


# -- PsutilProbe against real processes ---------------------------------------------------------


def test_this_process_is_alive_with_its_own_start_time() -> None:
    """PsutilProbe reads this process's start time, equal to its Incarnation, and it is alive."""
    probe = PsutilProbe()
    me = os.getpid()
    started = probe.start_time(me)
    assert started is not None
    assert started == Incarnation.current().started_at
    assert started == kernel_start_ticks(me)
    assert probe.pid_exists(me) is True
    assert owner_alive(me, started, probe) is True


def test_live_pid_with_wrong_start_time_is_dead() -> None:
    """A live pid recorded with another start time (a reused pid) is dead."""
    probe = PsutilProbe()
    me = os.getpid()
    started = probe.start_time(me)
    assert started is not None
    assert owner_alive(me, started - 1, probe) is False
    assert owner_alive(me, started + 3600, probe) is False


def test_real_child_alive_then_dead_after_kill(sleeper_child: subprocess.Popen[bytes]) -> None:
    """A live child is alive by its start time; after SIGKILL and reaping it is dead."""
    probe = PsutilProbe()
    pid = sleeper_child.pid
    started = probe.start_time(pid)
    assert started is not None
    assert started == kernel_start_ticks(pid)
    assert probe.pid_exists(pid) is True
    assert owner_alive(pid, started, probe) is True
    assert owner_alive(pid, None, probe) is True

    sleeper_child.send_signal(signal.SIGKILL)
    sleeper_child.wait(timeout=CHILD_TIMEOUT)

    assert probe.pid_exists(pid) is False
    assert probe.start_time(pid) is None
    assert owner_alive(pid, started, probe) is False
    assert owner_alive(pid, None, probe) is False


def test_killed_unreaped_child_zombie_is_dead(sleeper_child: subprocess.Popen[bytes]) -> None:
    """A killed child that has not been reaped yet (a zombie) already counts as dead."""
    probe = PsutilProbe()
    pid = sleeper_child.pid
    started = probe.start_time(pid)
    assert started is not None
    assert owner_alive(pid, started, probe) is True

    os.kill(pid, signal.SIGKILL)  # not Popen.kill(): that polls first and could reap early
    _wait_for_zombie(pid)

    assert probe.pid_exists(pid) is False
    assert probe.start_time(pid) is None
    assert owner_alive(pid, started, probe) is False
    assert owner_alive(pid, None, probe) is False
    assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # still unreaped

    sleeper_child.wait(timeout=CHILD_TIMEOUT)
    assert owner_alive(pid, started, probe) is False


@pytest.mark.parametrize("pid", [0, -1, True])
def test_psutil_probe_rejects_invalid_pids(pid: int) -> None:
    """PsutilProbe reports pid 0, negative and bool pids as absent with no start time."""
    probe = PsutilProbe()
    assert probe.pid_exists(pid) is False
    assert probe.start_time(pid) is None


def test_psutil_probe_gone_pid() -> None:
    """PsutilProbe reports a reaped pid as absent with no start time."""
    probe = PsutilProbe()
    gone = _gone_pid()
    assert probe.pid_exists(gone) is False
    assert probe.start_time(gone) is None


# -- Incarnation --------------------------------------------------------------------------------


class _NoStartTime(FakeProbe):
    """A probe that can never read a start time."""

    def start_time(self, pid: int) -> int | None:
        self.calls.append(("start_time", pid))
        return None


def test_current_incarnation_is_stable_in_process() -> None:
    """Incarnation.current() returns the same object (same token) every call in one process."""
    first = Incarnation.current()
    second = Incarnation.current()
    assert first is second
    assert first.token == second.token


def test_current_incarnation_matches_this_process() -> None:
    """Incarnation.current() records this host, pid and psutil start time, with a hex token."""
    inc = Incarnation.current()
    assert inc.host == host_identity()
    assert inc.host.split("/")[0] == (socket.gethostname() or "localhost")
    assert inc.pid == os.getpid()
    assert inc.started_at == kernel_start_ticks(os.getpid())
    assert len(inc.token) == 32  # 128 random bits
    int(inc.token, 16)  # hex
    assert inc.is_self(os.getpid(), inc.started_at)


def test_current_with_probe_lacking_start_time() -> None:
    """current(probe=...) with no readable start time gives started_at None and a fresh token."""
    cached = Incarnation.current()
    probe = _NoStartTime()
    one = Incarnation.current(probe=probe)
    two = Incarnation.current(probe=probe)
    assert one.started_at is None
    assert one.pid == os.getpid()
    assert one.token != two.token
    assert one.token != cached.token
    assert ("start_time", os.getpid()) in probe.calls
    assert Incarnation.current() is cached  # a custom probe never replaces the cached one


def test_current_with_raising_probe_has_no_start_time() -> None:
    """current(probe=...) with a probe that raises gives started_at None instead of raising."""
    inc = Incarnation.current(probe=FakeProbe({}, raise_in="start_time"))
    assert inc.started_at is None
    assert inc.pid == os.getpid()


def test_current_with_probe_uses_its_start_time() -> None:
    """current(probe=...) records the start time the given probe reports."""
    inc = Incarnation.current(probe=FakeProbe({os.getpid(): 123}))
    assert inc.started_at == 123


def test_is_self_requires_exact_pid_and_start_time() -> None:
    """is_self() is true only for this incarnation's exact pid and start time."""
    inc = Incarnation("host", 42, 1000, "tok")
    assert inc.is_self(42, 1000) is True
    assert inc.is_self(42, 1001) is False
    assert inc.is_self(43, 1000) is False
    assert inc.is_self(None, 1000) is False


def test_is_self_fails_closed_on_unknown_start_time() -> None:
    """is_self() is never true when either the recorded or own start time is None."""
    known = Incarnation("host", 42, 1000, "tok")
    unknown = Incarnation("host", 42, None, "tok")
    assert known.is_self(42, None) is False
    assert unknown.is_self(42, None) is False
    assert unknown.is_self(42, 1000) is False


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"pid": 0}, ValueError),
        ({"pid": -1}, ValueError),
        ({"pid": True}, ValueError),
        ({"pid": "42"}, ValueError),
        ({"started_at": "1000"}, TypeError),
        ({"started_at": 1000.0}, TypeError),
        ({"started_at": True}, TypeError),
        ({"host": ""}, ValueError),
        ({"host": None}, ValueError),
        ({"token": ""}, ValueError),
        ({"token": b"tok"}, ValueError),
    ],
)
def test_incarnation_validates_fields(kwargs: dict[str, object], error: type[Exception]) -> None:
    """Incarnation rejects a non-positive or bool pid, a non-int started_at and empty text."""
    fields: dict[str, object] = {"host": "h", "pid": 42, "started_at": 1000, "token": "t"}
    fields.update(kwargs)
    (name,) = kwargs
    with pytest.raises(error, match=name):
        Incarnation(**fields)  # type: ignore[arg-type]


def test_incarnation_accepts_none_started_at() -> None:
    """Incarnation accepts started_at None (an unknown start time)."""
    assert Incarnation("h", 1, None, "t").started_at is None


def test_incarnation_is_frozen() -> None:
    """Incarnation fields cannot be reassigned."""
    inc = Incarnation("host", 42, 1000, "tok")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        inc.pid = 43  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        inc.started_at = None  # type: ignore[misc]
    assert inc == Incarnation("host", 42, 1000, "tok")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_gets_its_own_incarnation() -> None:
    """A forked child's Incarnation.current() has the child's pid, start time and a new token."""
    parent = Incarnation.current()  # populate the cache the child inherits
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        status = 1
        try:
            os.close(read_end)
            child = Incarnation.current()
            payload = {
                "pid": child.pid,
                "started_at": child.started_at,
                "token": child.token,
                "stable": Incarnation.current() is child,
                "real_pid": os.getpid(),
                "real_started": kernel_start_ticks(os.getpid()),
            }
            os.write(write_end, json.dumps(payload).encode())
            status = 0
        finally:
            os._exit(status)

    os.close(write_end)
    try:
        chunks: list[bytes] = []
        deadline = time.monotonic() + CHILD_TIMEOUT
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _reap(pid)

    assert chunks, "forked child reported nothing"
    child = json.loads(b"".join(chunks))
    assert child["pid"] == child["real_pid"] == pid
    assert child["pid"] != parent.pid
    assert child["token"] != parent.token
    assert child["started_at"] == child["real_started"]
    assert child["stable"] is True
    assert Incarnation.current() is parent  # the parent's incarnation is untouched


def _reap(pid: int) -> None:
    """Wait (bounded) for a forked child to exit; kill it if it does not."""
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("forked child did not exit in time")
