"""Tests for statecore.clock: SystemClock, FakeClock and Deadline.

No test here waits on real time for a timeout: FakeClock moves time.  The only real-time bounds
are ``asyncio.wait_for`` guards of a few seconds, so a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from statecore.clock import Clock, Deadline, FakeClock, SystemClock

GUARD = 5.0
"""Real seconds any single await in these tests may take before the test fails."""


async def _spin(turns: int = 5) -> None:
    """Give the event loop a few turns so that any woken task gets to run."""
    for _ in range(turns):
        await asyncio.sleep(0)


def _waiting(clock: FakeClock) -> tuple[int, float | None]:
    """(sleepers, next_deadline), read fresh (no type narrowing from earlier asserts)."""
    return clock.sleepers, clock.next_deadline


# -- SystemClock ----------------------------------------------------------------------------


def test_system_clock_now_is_wall_time() -> None:
    """SystemClock.now() returns epoch seconds close to time.time()."""
    clock = SystemClock()
    before = time.time()
    now = clock.now()
    after = time.time()
    assert before - 1.0 <= now <= after + 1.0


def test_system_clock_monotonic_never_decreases() -> None:
    """SystemClock.monotonic() is non-decreasing over many reads and tracks time.monotonic()."""
    clock = SystemClock()
    readings = [clock.monotonic() for _ in range(1000)]
    assert readings == sorted(readings)
    assert abs(clock.monotonic() - time.monotonic()) < 1.0


def test_clocks_satisfy_clock_protocol() -> None:
    """SystemClock and FakeClock are both runtime instances of the Clock protocol."""
    assert isinstance(SystemClock(), Clock)
    assert isinstance(FakeClock(), Clock)


@pytest.mark.asyncio
@pytest.mark.parametrize("seconds", [0, 0.0, -1, -1e9, math.nan, -math.inf])
async def test_system_clock_sleep_non_positive_returns_promptly(seconds: float) -> None:
    """SystemClock.sleep() of zero, a negative or a NaN duration returns at once."""
    clock = SystemClock()
    started = time.monotonic()
    await asyncio.wait_for(clock.sleep(seconds), timeout=GUARD)
    assert time.monotonic() - started < 1.0


@pytest.mark.asyncio
@pytest.mark.parametrize("clock", [SystemClock(), FakeClock()], ids=["system", "fake"])
@pytest.mark.parametrize("bad", ["1", None, b"1", [1]])
async def test_sleep_rejects_non_numbers(clock: Clock, bad: object) -> None:
    """Clock.sleep() with a non-number duration raises TypeError (no silent zero-sleep)."""
    with pytest.raises(TypeError, match="number of seconds"):
        await clock.sleep(bad)  # type: ignore[arg-type]


def test_system_clock_repr() -> None:
    """SystemClock has a stable, readable repr."""
    assert repr(SystemClock()) == "SystemClock()"


# -- FakeClock: reading and moving time -----------------------------------------------------


def test_fake_clock_default_start_values() -> None:
    """A default FakeClock starts at wall 1_700_000_000.0 and monotonic 0.0."""
    clock = FakeClock()
    assert clock.now() == 1_700_000_000.0
    assert clock.monotonic() == 0.0
    assert clock.sleepers == 0
    assert clock.next_deadline is None


def test_fake_clock_custom_start_values() -> None:
    """FakeClock(start, monotonic_start=...) sets both clocks independently."""
    clock = FakeClock(100.0, monotonic_start=5.0)
    assert clock.now() == 100.0
    assert clock.monotonic() == 5.0


def test_fake_clock_does_not_move_by_itself() -> None:
    """FakeClock time stands still until advance() is called."""
    clock = FakeClock()
    first = (clock.now(), clock.monotonic())
    real_start = time.monotonic()
    for _ in range(10_000_000):  # spin (bounded) until real time visibly moves
        if time.monotonic() > real_start:
            break
    assert time.monotonic() > real_start
    assert (clock.now(), clock.monotonic()) == first


def test_fake_clock_advance_moves_both_clocks() -> None:
    """advance() moves wall and monotonic time forward by the same step."""
    clock = FakeClock(100.0, monotonic_start=5.0)
    clock.advance(2.5)
    assert clock.now() == 102.5
    assert clock.monotonic() == 7.5
    clock.advance(0)
    assert clock.monotonic() == 7.5
    clock.advance(3)
    assert clock.now() == 105.5
    assert clock.monotonic() == 10.5


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, math.inf, -math.inf, "1", None, [1]])
def test_fake_clock_advance_rejects_bad_steps(bad: object) -> None:
    """advance() rejects negative, NaN, infinite or non-number steps (ValueError), time kept."""
    clock = FakeClock()
    with pytest.raises(ValueError, match="finite, non-negative number"):
        clock.advance(bad)  # type: ignore[arg-type]
    assert clock.monotonic() == 0.0
    assert clock.now() == 1_700_000_000.0


def test_fake_clock_set_wall_changes_only_wall_time() -> None:
    """set_wall() jumps now() but leaves monotonic() alone, and later advances add to both."""
    clock = FakeClock(monotonic_start=3.0)
    clock.set_wall(42.0)
    assert clock.now() == 42.0
    assert clock.monotonic() == 3.0
    clock.advance(1.0)
    assert clock.now() == 43.0
    assert clock.monotonic() == 4.0
    clock.set_wall(10.0)  # wall time may go backwards (NTP); monotonic never does
    assert clock.now() == 10.0
    assert clock.monotonic() == 4.0


@pytest.mark.asyncio
async def test_fake_clock_set_wall_does_not_wake_sleepers() -> None:
    """set_wall() far into the future does not wake a monotonic sleeper."""
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(5))
    await _spin()
    clock.set_wall(clock.now() + 1_000_000)
    await _spin()
    assert not task.done()
    clock.advance(5)
    await asyncio.wait_for(task, timeout=GUARD)


# -- FakeClock: sleeping ----------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("seconds", [0, 0.0, -3, math.nan])
async def test_fake_clock_non_positive_sleep_yields_once(seconds: float) -> None:
    """FakeClock.sleep() of <= 0 or NaN returns without advance() but still yields to the loop."""
    clock = FakeClock()
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    task = asyncio.create_task(other())
    await asyncio.wait_for(clock.sleep(seconds), timeout=GUARD)
    assert ran == ["other"]  # the scheduled task ran while sleep() yielded
    assert clock.sleepers == 0
    assert clock.monotonic() == 0.0
    await task


@pytest.mark.asyncio
async def test_fake_clock_sleeper_wakes_only_at_its_deadline() -> None:
    """A FakeClock sleeper stays asleep until advance() reaches its deadline, then wakes."""
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep(10))
    await _spin()
    assert clock.sleepers == 1
    assert clock.next_deadline == 10.0

    clock.advance(4)
    await _spin()
    assert not task.done()
    clock.advance(5.5)  # 9.5: still short of 10
    await _spin()
    assert not task.done()
    assert clock.sleepers == 1

    clock.advance(0.5)  # exactly 10.0
    await asyncio.wait_for(task, timeout=GUARD)
    assert clock.sleepers == 0
    assert clock.next_deadline is None


@pytest.mark.asyncio
async def test_fake_clock_deadline_is_relative_to_sleep_call() -> None:
    """A sleep started after time has moved counts from the moment it was called."""
    clock = FakeClock(monotonic_start=100.0)
    clock.advance(50)
    task = asyncio.create_task(clock.sleep(5))
    await _spin()
    assert clock.next_deadline == 155.0
    clock.advance(4)
    await _spin()
    assert not task.done()
    clock.advance(1)
    await asyncio.wait_for(task, timeout=GUARD)


@pytest.mark.asyncio
async def test_fake_clock_advance_wakes_only_due_sleepers() -> None:
    """advance() wakes the sleepers whose deadline passed and leaves later ones asleep."""
    clock = FakeClock()
    early = asyncio.create_task(clock.sleep(1))
    late = asyncio.create_task(clock.sleep(5))
    await _spin()
    assert clock.sleepers == 2

    clock.advance(2)
    await asyncio.wait_for(early, timeout=GUARD)
    await _spin()
    assert not late.done()
    assert clock.sleepers == 1
    assert clock.next_deadline == 5.0

    clock.advance(3)
    await asyncio.wait_for(late, timeout=GUARD)


@pytest.mark.asyncio
async def test_fake_clock_sleepers_wake_in_deadline_order() -> None:
    """One big advance() wakes several sleepers in deadline order, ties in sleep-call order."""
    clock = FakeClock()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [
        asyncio.create_task(sleeper(name, seconds))
        for name, seconds in [("c", 3), ("a", 1), ("d", 3), ("b", 2), ("e", 4)]
    ]
    await _spin()
    assert clock.sleepers == 5
    assert clock.next_deadline == 1.0

    clock.advance(10)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=GUARD)
    assert woke == ["a", "b", "c", "d", "e"]


@pytest.mark.asyncio
async def test_fake_clock_cancelled_sleepers_are_forgotten() -> None:
    """A cancelled sleeper stops counting in .sleepers and .next_deadline moves to the next one."""
    clock = FakeClock()
    first = asyncio.create_task(clock.sleep(5))
    second = asyncio.create_task(clock.sleep(10))
    await _spin()
    assert clock.sleepers == 2
    assert clock.next_deadline == 5.0

    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert clock.sleepers == 1
    assert clock.next_deadline == 10.0

    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert _waiting(clock) == (0, None)
    clock.advance(20)  # advancing past forgotten deadlines is harmless
    assert clock.sleepers == 0


@pytest.mark.asyncio
async def test_fake_clock_many_cancelled_sleepers_do_not_accumulate() -> None:
    """Abandoned waits (e.g. wait_for timeouts) are dropped, leaving a live sleeper intact."""
    clock = FakeClock()
    keeper = asyncio.create_task(clock.sleep(1000))
    doomed = [asyncio.create_task(clock.sleep(i + 1)) for i in range(200)]
    await _spin()
    assert clock.sleepers == 201
    for task in doomed:
        task.cancel()
    results = await asyncio.wait_for(asyncio.gather(*doomed, return_exceptions=True), timeout=GUARD)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert clock.sleepers == 1
    # .sleepers skips cancelled entries anyway; only the internal heap shows they were dropped.
    assert len(clock._sleepers) == 1
    assert clock.next_deadline == 1000.0
    clock.advance(1000)
    await asyncio.wait_for(keeper, timeout=GUARD)


def test_fake_clock_advance_from_another_thread_wakes_sleeper() -> None:
    """advance() called from a different thread wakes a sleeper on the event loop's thread."""
    # A private loop in debug mode: the loop raises if another thread touches it without
    # call_soon_threadsafe, and on failure the loop is abandoned instead of waiting on a task
    # that can never be woken (pytest-asyncio's teardown would wait for it forever).
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    clock = FakeClock()
    errors: list[BaseException] = []

    def advance_in_thread() -> None:
        try:
            clock.advance(3)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=advance_in_thread, name="advance-thread")

    async def scenario() -> bool:
        task = asyncio.create_task(clock.sleep(3))
        await _spin()
        assert clock.sleepers == 1
        thread.start()  # advance() runs while this loop is running (and usually blocked)
        done, _ = await asyncio.wait({task}, timeout=GUARD)
        return task in done

    try:
        woke = loop.run_until_complete(scenario())
        thread.join(timeout=GUARD)
        assert not thread.is_alive()
        assert errors == []
        assert woke
        assert clock.monotonic() == 3.0
        assert clock.sleepers == 0
    finally:
        if thread.is_alive():
            thread.join(timeout=GUARD)
        loop.close()


def test_fake_clock_repr_shows_monotonic_time() -> None:
    """FakeClock's repr names its current monotonic time."""
    clock = FakeClock(monotonic_start=2.0)
    clock.advance(1.5)
    assert repr(clock) == "FakeClock(monotonic=3.5)"


# -- Deadline -------------------------------------------------------------------------------


def test_deadline_after_counts_down_with_fake_clock() -> None:
    """Deadline.after() fixes an absolute point; remaining() shrinks as the clock advances."""
    clock = FakeClock(monotonic_start=7.0)
    deadline = Deadline.after(clock, 10)
    assert deadline.at == 17.0
    assert deadline.remaining() == 10.0
    assert not deadline.expired

    clock.advance(4)
    assert deadline.remaining() == 6.0
    assert not deadline.expired

    clock.advance(6)
    assert deadline.remaining() == 0.0
    assert deadline.expired


def test_deadline_remaining_clamps_at_zero() -> None:
    """Deadline.remaining() never goes negative after the deadline has passed."""
    clock = FakeClock()
    deadline = Deadline.after(clock, 1)
    clock.advance(100)
    assert deadline.remaining() == 0.0
    assert deadline.expired


@pytest.mark.parametrize("seconds", [-1, -0.5, 0, math.nan])
def test_deadline_with_no_time_is_already_expired(seconds: float) -> None:
    """A negative, zero or NaN duration gives a deadline that is already expired."""
    clock = FakeClock(monotonic_start=50.0)
    deadline = Deadline.after(clock, seconds)
    assert deadline.expired
    assert deadline.remaining() == 0.0
    assert deadline.at == 50.0


def test_deadline_is_shared_not_rederived() -> None:
    """Two readers of one Deadline see the same remaining budget as time passes."""
    clock = FakeClock()
    deadline = Deadline.after(clock, 30)
    clock.advance(10)
    passed_down = deadline  # a lower layer receives the absolute deadline, not "30 seconds"
    assert passed_down.remaining() == 20.0
    assert Deadline.after(clock, passed_down.remaining()).at == deadline.at


@pytest.mark.parametrize("bad", ["1", None, b"1"])
def test_deadline_after_rejects_non_numbers(bad: object) -> None:
    """Deadline.after() with a non-number duration raises TypeError."""
    with pytest.raises(TypeError, match="number of seconds"):
        Deadline.after(FakeClock(), bad)  # type: ignore[arg-type]


def test_deadline_works_with_system_clock() -> None:
    """Deadline.after() on SystemClock is not expired for a long budget and expired for none."""
    clock = SystemClock()
    assert not Deadline.after(clock, 3600).expired
    assert 0.0 < Deadline.after(clock, 3600).remaining() <= 3600.0
    assert Deadline.after(clock, -1).expired
