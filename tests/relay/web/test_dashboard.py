"""The dashboard's WebSocket protocol, with a real ``WebServer`` on loopback, a real SQLite store
and a real ``Ledger`` making obligations: counts, the live stream, one obligation's history, the
operator's actions with and without a valid token, refusals, and bad input from a browser."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from relay.web._dashboard_reads import latest_obligations
from relay.web.dashboard import Dashboard
from relay.web.server import WebServer
from relay.wire.auth import mint_token
from statecore import Ledger
from statecore.cli.lifecycles import all_lifecycles
from statecore.clock import FakeClock
from statecore.gateway import Gateway
from statecore.ids import compute_obligation_id
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.policy import ErrorKind
from statecore.repair import retry_id
from stores import SQLiteStore
from stores.memory import InMemoryStore
from tests.statecore.gateway.gateway_rig import PROBE, FakeAdapter, FakeSessions, live_incarnation

BOUND_S = 10.0
SECRET = "s3cret-for-alice"
SECRETS = {"alice": [SECRET]}


@attrs.define
class Stack:
    store: SQLiteStore
    ledger: Ledger
    dashboard: Dashboard
    url: str  # the dashboard's WebSocket

    def record(self, content: str = "hello", chat: str = "c1") -> str:
        return self.ledger.record(
            session_key=f"s-{content}-{time.monotonic_ns()}",
            platform="web",
            chat_id=chat,
            content=content,
        ).obligation_id

    def deliver(self, obligation_id: str) -> None:
        self.ledger.mark_attempting(obligation_id)
        self.ledger.mark_delivered(obligation_id)

    def fail(self, obligation_id: str, error: str, kind: ErrorKind) -> None:
        self.ledger.mark_attempting(obligation_id)
        self.ledger.mark_failed(obligation_id, error, kind=kind)


@asynccontextmanager
async def running(tmp_path: Path, **options: Any) -> AsyncIterator[Stack]:
    store = SQLiteStore(tmp_path / "x.db")
    ledger = Ledger(store)
    options.setdefault("show_content", True)
    dashboard = Dashboard(store, poll_s=0.05, **options)
    server = WebServer([dashboard])
    await server.start()
    try:
        yield Stack(store, ledger, dashboard, server.url.replace("http", "ws") + "/dashboard/ws")
    finally:
        await server.stop()
        await dashboard.close()
        store.close()


async def receive(
    ws: ClientConnection, kind: str, match: Callable[[dict[str, Any]], bool] = lambda m: True
) -> dict[str, Any]:
    """The next message of type ``kind`` that ``match`` accepts (bounded)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no {kind!r} message within {BOUND_S} s"
        message: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), left))
        if message["type"] == kind and match(message):
            return message


async def ask(ws: ClientConnection, message: dict[str, Any], kind: str) -> dict[str, Any]:
    await ws.send(json.dumps(message))
    return await receive(ws, kind)


def counts_of(message: dict[str, Any], kind: str = "obligation") -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in message["counts"] if c["kind"] == kind)
    return found


@pytest.mark.asyncio
async def test_a_new_browser_gets_counts_of_every_kind_and_the_diagrams(tmp_path: Path) -> None:
    """The snapshot: every watched kind with every declared state (zeros for empty tables), the
    owed obligations, the oldest owed age, and an SVG diagram of every lifecycle the
    ``statecore.lifecycles`` entry points declare, those of the counted kinds naming their
    kind; no secret anywhere."""
    async with running(tmp_path, secrets=SECRETS, store_label="sqlite:///x.db") as stack:
        first = stack.record("one")
        stack.record("two")
        async with connect(stack.url) as ws:
            hello = await receive(ws, "hello")
    assert hello["store"] == "sqlite:///x.db"
    assert hello["writable"] is True
    assert [c["kind"] for c in hello["counts"]] == [
        "obligation",
        "buffer_entry",
        "session",
        "delegation",
        "held_inbound",
        "rejected_inbound",
    ]
    obligations = counts_of(hello)
    assert obligations["states"] == {
        "pending": 2,
        "attempting": 0,
        "delivered": 0,
        "failed": 0,
        "abandoned": 0,
    }
    assert obligations["owed"] == 2
    assert obligations["oldest_owed_id"] == first
    assert 0 <= obligations["oldest_owed_age_s"] < BOUND_S
    for kind in ("buffer_entry", "session", "delegation"):
        empty = counts_of(hello, kind)
        assert set(empty["states"].values()) == {0}, kind
        assert (empty["owed"], empty["oldest_owed_at"]) == (0, None)
    declared = [lc.name for lc in all_lifecycles()]
    assert len(declared) >= 12
    assert [d["lifecycle"] for d in hello["diagrams"]] == declared
    counted = {d["lifecycle"]: d["kind"] for d in hello["diagrams"] if d["kind"] is not None}
    assert counted == {
        "obligation": "obligation",
        "buffer": "buffer_entry",
        "session": "session",
        "delegation": "delegation",
        "held_inbound": "held_inbound",
        "rejected_inbound": "rejected_inbound",
    }
    assert all(d["svg"].startswith("<svg") for d in hello["diagrams"])
    assert {o["content"] for o in hello["obligations"]} == {"one", "two"}
    assert SECRET not in json.dumps(hello)


@pytest.mark.asyncio
async def test_transitions_are_streamed_as_they_happen_and_counts_follow(tmp_path: Path) -> None:
    """A row recorded, attempted and delivered after the browser connected arrives as changes
    (with the event and the state it came from), and the counts follow."""
    async with running(tmp_path) as stack, connect(stack.url) as ws:
        await receive(ws, "hello")
        oid = stack.record("streamed")
        changes = await receive(ws, "changes")
        change = changes["changes"][0]
        assert (change["kind"], change["id"], change["state"]) == ("obligation", oid, "pending")
        assert (change["event"], change["from"], change["content"]) == (
            "record",
            None,
            "streamed",
        )
        counts = await receive(ws, "counts", lambda m: counts_of(m)["states"]["pending"] == 1)
        assert counts_of(counts)["owed"] == 1
        stack.deliver(oid)
        delivered = await receive(
            ws, "changes", lambda m: any(c["state"] == "delivered" for c in m["changes"])
        )
        last = delivered["changes"][-1]
        assert (last["event"], last["from"], last["state"]) == (
            "deliver",
            "attempting",
            "delivered",
        )
        counts = await receive(ws, "counts", lambda m: counts_of(m)["states"]["delivered"] == 1)
        assert counts_of(counts)["owed"] == 0


@pytest.mark.asyncio
async def test_replies_text_is_hidden_unless_the_dashboard_shows_it(tmp_path: Path) -> None:
    """By default the page never receives what the bot told a user (anyone who can open the
    page would read every chat): not in the owed list, the stream or a history; only the
    deployer's ``show_content=True`` sends it."""
    async with running(tmp_path, show_content=False) as stack:
        owed = stack.record("a private reply")
        async with connect(stack.url) as ws:
            hello = await receive(ws, "hello")
            streamed = stack.record("another private reply")
            changes = await receive(
                ws, "changes", lambda m: any(c["id"] == streamed for c in m["changes"])
            )
            await ws.send(json.dumps({"type": "history", "id": owed}))
            history = await receive(ws, "history")
    rows = [*hello["obligations"], *changes["changes"], history["row"]]
    assert {row["id"] for row in rows} == {owed, streamed}
    assert all(row["content"] == "" and row["content_hidden"] is True for row in rows)
    assert "private" not in json.dumps([hello, changes, history])


@pytest.mark.asyncio
async def test_a_browser_that_connects_later_gets_the_recent_transitions(tmp_path: Path) -> None:
    """Changes seen while one browser watched are in the next browser's snapshot (the ring)."""
    async with running(tmp_path) as stack:
        async with connect(stack.url) as first:
            await receive(first, "hello")
            oid = stack.record("early")
            await receive(first, "changes")
        async with connect(stack.url) as second:
            hello = await receive(second, "hello")
    assert [c["id"] for c in hello["recent"]] == [oid]


@pytest.mark.asyncio
async def test_one_obligations_history_on_request(tmp_path: Path) -> None:
    """The audit entries of one obligation, oldest first; an unknown id is found=False."""
    async with running(tmp_path) as stack:
        oid = stack.record("traced")
        stack.deliver(oid)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            history = await ask(ws, {"type": "history", "id": oid}, "history")
            missing = await ask(ws, {"type": "history", "id": "nope"}, "history")
    assert history["found"] is True
    assert history["row"]["state"] == "delivered"
    assert [(r["from"], r["to"], r["event"]) for r in history["records"]] == [
        (None, "pending", "record"),
        ("pending", "attempting", "attempt"),
        ("attempting", "delivered", "deliver"),
    ]
    assert set(history["records"][0]) == {
        "from",
        "to",
        "event",
        "at",
        "owner",
        "attempts",
        "reason",
    }
    assert (missing["found"], missing["records"]) == (False, [])


@pytest.mark.asyncio
async def test_an_operator_with_a_valid_token_abandons_and_retries(tmp_path: Path) -> None:
    """Abandon an owed row, then retry it: the CLI's repairs, audited as dashboard:alice with
    the typed reason; the moves show up in the stream."""
    async with running(tmp_path, secrets=SECRETS) as stack:
        oid = stack.record("stuck")
        token = mint_token("alice", SECRET)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            auth = await ask(ws, {"type": "auth", "token": token}, "auth")
            assert auth["operator"] == "alice"
            action = {"type": "abandon", "id": oid, "reason": "stuck for ages", "token": token}
            done = await ask(ws, action, "done")
            assert (done["operator"], done["state"]) == ("alice", "abandoned")
            await receive(
                ws, "changes", lambda m: any(c["state"] == "abandoned" for c in m["changes"])
            )
            retry = {"type": "retry", "id": oid, "reason": "try again", "token": token}
            retried = await ask(ws, retry, "done")
            assert retried["new_id"] == retry_id(oid)
            assert SECRET not in json.dumps([auth, done, retried])
            assert token not in json.dumps([auth, done, retried])
        history = stack.store.history(OBLIGATION_KIND, oid)
        assert (history[-1].event, history[-1].owner) == ("abandon", "dashboard:alice")
        assert history[-1].reason == "abandoned by alice: stuck for ages"
        new = stack.store.get(OBLIGATION_KIND, retry_id(oid))
        assert new is not None
        assert new.state is ObligationState.PENDING


@pytest.mark.asyncio
@pytest.mark.parametrize("secrets", [None, SECRETS], ids=["no-secrets", "with-secrets"])
@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "read-only"),
        ("garbage", "malformed"),
        (mint_token("alice", "not-the-secret"), "forged"),
        (mint_token("mallory", SECRET), "unknown"),
        (mint_token("alice", SECRET, now=time.time() - 7200), "expired"),
    ],
    ids=["none", "malformed", "forged", "unknown", "expired"],
)
async def test_no_action_without_a_valid_token(
    tmp_path: Path, secrets: dict[str, list[str]] | None, token: str, reason: str
) -> None:
    """Without a verified token (or without any secret configured) every action is refused,
    saying why, and nothing is written."""
    async with running(tmp_path, secrets=secrets) as stack:
        oid = stack.record("owed")
        before = stack.store.history(OBLIGATION_KIND, oid)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            for kind in ("abandon", "retry"):
                message = {"type": kind, "id": oid, "reason": "r", "token": token}
                refused = await ask(ws, message, "refused")
                assert refused["action"] == kind
                assert (reason if secrets else "read-only") in refused["reason"]
            if not token:  # a missing token is the same as an empty one
                message = {"type": "abandon", "id": oid, "reason": "r"}
                assert "read-only" in (await ask(ws, message, "refused"))["reason"]
        assert stack.store.history(OBLIGATION_KIND, oid) == before


@pytest.mark.asyncio
async def test_an_action_on_a_row_in_the_wrong_state_is_refused(tmp_path: Path) -> None:
    """Abandon a delivered row, retry an owed one, act on an unknown id: each refused with the
    store's reason, nothing changes, and the session goes on."""
    async with running(tmp_path, secrets=SECRETS) as stack:
        delivered = stack.record("sent")
        stack.deliver(delivered)
        owed = stack.record("owed")
        token = mint_token("alice", SECRET)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            cases = [("abandon", delivered, "delivered"), ("retry", owed, "pending")]
            for action, oid, state in cases:
                message = {"type": action, "id": oid, "reason": "r", "token": token}
                refused = await ask(ws, message, "refused")
                assert state in refused["reason"]
                assert refused["operator"] == "alice"
            message = {"type": "abandon", "id": "no-such-row", "reason": "r", "token": token}
            assert "no-such-row" in (await ask(ws, message, "refused"))["reason"]
            assert (await ask(ws, {"type": "history", "id": owed}, "history"))["found"]
        assert stack.store.get(OBLIGATION_KIND, delivered).state is ObligationState.DELIVERED  # type: ignore[union-attr]
        assert stack.store.get(OBLIGATION_KIND, owed).state is ObligationState.PENDING  # type: ignore[union-attr]
        assert stack.store.get(OBLIGATION_KIND, retry_id(owed)) is None


@pytest.mark.asyncio
async def test_bad_input_is_answered_and_never_breaks_the_session(tmp_path: Path) -> None:
    """Malformed JSON, non-objects, unknown types, wrong field types, overlong fields and binary
    frames are each answered with an error; the session still works. A frame past the server's
    bound closes that connection (1009) and the server goes on serving."""
    bad: list[str | bytes] = [
        "not json",
        "[1, 2]",
        "null",
        '{"type": 5}',
        '{"no": "type"}',
        '{"type": "drop_tables"}',
        '{"type": "history"}',
        '{"type": "history", "id": 12}',
        '{"type": "history", "id": ""}',
        json.dumps({"type": "history", "id": "x" * 5000}),
        json.dumps({"type": "abandon", "id": "a", "reason": ["r"], "token": "t"}),
        json.dumps({"type": "abandon", "id": "a", "reason": "r", "token": 7}),
        "[" * 5000 + "]" * 5000,
        b"\x00\xff binary",
    ]
    async with running(tmp_path, secrets=SECRETS) as stack:
        oid = stack.record("fine")
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            for frame in bad:
                await ws.send(frame)
                error = await receive(ws, "error")
                assert error["error"], frame
                assert "x" * 100 not in error["error"]
            history = await ask(ws, {"type": "history", "id": oid}, "history")
            assert history["found"]
        async with connect(stack.url, max_size=None) as ws:
            await receive(ws, "hello")
            await ws.send("x" * 200_000)
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(receive(ws, "never"), BOUND_S)
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == 1009
        async with connect(stack.url) as ws:
            assert (await receive(ws, "hello"))["type"] == "hello"


def test_poll_interval_must_be_positive(tmp_path: Path) -> None:
    """A dashboard that would never poll is refused when made."""
    store = SQLiteStore(tmp_path / "x.db")
    try:
        with pytest.raises(ValueError, match="poll_s"):
            Dashboard(store, poll_s=0)
    finally:
        store.close()


@pytest.mark.asyncio
async def test_a_gateway_reply_streams_its_record_attempt_and_deliver(tmp_path: Path) -> None:
    """A real gateway's reply on SQLite (record, mark attempting, send, settle; faster than a
    poll) reaches the stream as its three transitions, in order, each with the state it came
    from: record (-> pending), attempt (pending -> attempting), deliver (attempting ->
    delivered)."""
    async with running(tmp_path) as stack, connect(stack.url) as ws:
        await receive(ws, "hello")
        gateway = Gateway(
            SQLiteStore(tmp_path / "x.db"),  # the bot's own connection to the same file
            sessions=FakeSessions(),
            incarnation=live_incarnation(),
            probe=PROBE,
            retry_interval_s=3600.0,
        )
        try:
            gateway.add_adapter("web", FakeAdapter())
            result = await gateway.send_final(
                session_key="web:s1", platform="web", chat_id="c1", content="hi", message_ref="m1"
            )
            assert result.success
            oid = compute_obligation_id("web:s1", "m1", "hi")
            seen: list[tuple[str | None, str | None, str]] = []
            while not seen or seen[-1][2] != "delivered":
                changes = await receive(ws, "changes")
                seen += [
                    (c["event"], c["from"], c["state"])
                    for c in changes["changes"]
                    if c["id"] == oid
                ]
        finally:
            await asyncio.wait_for(gateway.stop(budget_s=1.0), BOUND_S)
    assert seen == [
        ("record", None, "pending"),
        ("attempt", "pending", "attempting"),
        ("deliver", "attempting", "delivered"),
    ]


@pytest.mark.asyncio
async def test_each_audit_entry_is_streamed_once_across_polls(tmp_path: Path) -> None:
    """A row moved between polls has only its new audit entries streamed: an entry already
    sent is never sent again, however often the row is read."""
    async with running(tmp_path) as stack, connect(stack.url) as ws:
        await receive(ws, "hello")
        oid = stack.record("twice")
        first = await receive(ws, "changes")
        stack.deliver(oid)
        second = await receive(
            ws, "changes", lambda m: any(c["state"] == "delivered" for c in m["changes"])
        )
        other = stack.record("later")
        third = await receive(ws, "changes", lambda m: any(c["id"] == other for c in m["changes"]))
    events = [c["event"] for m in (first, second, third) for c in m["changes"] if c["id"] == oid]
    assert events == ["record", "attempt", "deliver"]


@pytest.mark.asyncio
async def test_settled_rows_are_listed_newest_change_first(tmp_path: Path) -> None:
    """A new browser gets the latest changed obligations whatever their state (the delivered
    and abandoned ones too, which the owed list leaves out), newest change first, each one's
    history a click away."""
    async with running(tmp_path, secrets=SECRETS) as stack:
        first, second, owed = stack.record("a"), stack.record("b"), stack.record("c")
        stack.deliver(first)
        stack.deliver(second)
        async with connect(stack.url) as ws:
            hello = await receive(ws, "hello")
            history = await ask(ws, {"type": "history", "id": first}, "history")
    latest = [(row["id"], row["state"]) for row in hello["latest"]]
    assert latest == [(second, "delivered"), (first, "delivered"), (owed, "pending")]
    assert [row["id"] for row in hello["obligations"]] == [owed]
    assert history["found"] is True
    assert [r["event"] for r in history["records"]] == ["record", "attempt", "deliver"]


def test_the_latest_obligations_are_the_newest_changes_at_most_the_limit() -> None:
    """``latest_obligations`` returns the ``limit`` most recently changed rows (any state),
    newest first, also when many rows share one change time and when older rows abound."""
    clock = FakeClock()
    store = InMemoryStore()
    ledger = Ledger(store, clock=clock)
    made = []
    for n in range(40):
        made.append(
            ledger.record(
                session_key=f"k{n}", platform="web", chat_id="c", content=f"r{n}"
            ).obligation_id
        )
        clock.advance(0.0 if 10 <= n < 30 else 3600.0 * n)  # rows 10-30 share one time
    ledger.mark_attempting(made[3])
    ledger.mark_delivered(made[3])  # changed last, though made early
    latest = latest_obligations(store, now=clock.now(), show_content=False, limit=5)
    assert [row["id"] for row in latest] == [made[3], *reversed(made[-4:])]
    assert latest[0]["state"] == "delivered"
    tied = latest_obligations(store, now=clock.now(), show_content=False, limit=25)
    assert [row["id"] for row in tied][:10] == [made[3], *reversed(made[31:])]
    assert {row["id"] for row in tied[10:]} <= set(made[10:31])  # 15 of the 21 that share a time
    assert len(tied) == 25
    assert latest_obligations(InMemoryStore(), now=clock.now(), show_content=False) == []
    with pytest.raises(ValueError, match="limit"):
        latest_obligations(store, now=clock.now(), show_content=False, limit=0)


@pytest.mark.asyncio
async def test_the_actions_each_state_allows_come_from_the_lifecycle(tmp_path: Path) -> None:
    """The snapshot says which repair each obligation state allows, from the declared
    lifecycle: abandon where the lifecycle lets ``abandon`` leave the state, retry on the state
    ``abandon`` leads to; a delivered row allows neither."""
    async with running(tmp_path, secrets=SECRETS) as stack, connect(stack.url) as ws:
        hello = await receive(ws, "hello")
    assert hello["actions"] == {
        "pending": ["abandon"],
        "attempting": ["abandon"],
        "delivered": [],
        "failed": ["abandon"],
        "abandoned": ["retry"],
    }


@pytest.mark.asyncio
async def test_a_repair_the_lifecycle_does_not_allow_is_refused_saying_so(tmp_path: Path) -> None:
    """Abandon of a delivered or abandoned row and retry of a delivered or owed one are refused
    by the server whatever the page offers, naming the row's state and where the lifecycle
    allows the repair; nothing is written."""
    async with running(tmp_path, secrets=SECRETS) as stack:
        delivered, owed, dropped = stack.record("a"), stack.record("b"), stack.record("c")
        stack.deliver(delivered)
        token = mint_token("alice", SECRET)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            await ask(ws, {"type": "abandon", "id": dropped, "reason": "r", "token": token}, "done")
            before = {oid: stack.store.history(OBLIGATION_KIND, oid) for oid in (delivered, owed)}
            reasons = {}
            for action, oid in [
                ("abandon", delivered),
                ("abandon", dropped),
                ("retry", delivered),
                ("retry", owed),
            ]:
                message = {"type": action, "id": oid, "reason": "r", "token": token}
                reasons[(action, oid)] = (await ask(ws, message, "refused"))["reason"]
        after = {oid: stack.store.history(OBLIGATION_KIND, oid) for oid in before}
        retried = stack.store.get(OBLIGATION_KIND, retry_id(delivered))
    only_owed = "only from pending, attempting, failed"
    assert reasons == {
        ("abandon", delivered): f"abandon is not allowed for a delivered obligation ({only_owed})",
        ("abandon", dropped): f"abandon is not allowed for an abandoned obligation ({only_owed})",
        (
            "retry",
            delivered,
        ): "retry is not allowed for a delivered obligation (only from abandoned)",
        ("retry", owed): "retry is not allowed for a pending obligation (only from abandoned)",
    }
    assert after == before
    assert retried is None


@pytest.mark.asyncio
async def test_a_token_living_past_the_cap_is_refused_naming_its_lifetime(tmp_path: Path) -> None:
    """A genuine token minted for 12 h is refused by a dashboard with the default 1 h cap,
    saying its lifetime exceeds the cap (not that it is malformed, and with no doubled
    "refused"); nothing is written."""
    async with running(tmp_path, secrets=SECRETS) as stack:
        oid = stack.record("owed")
        token = mint_token("alice", SECRET, ttl_s=12 * 3600)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            auth = await ask(ws, {"type": "auth", "token": token}, "auth")
            message = {"type": "abandon", "id": oid, "reason": "r", "token": token}
            refused = await ask(ws, message, "refused")
        assert stack.store.get(OBLIGATION_KIND, oid).state is ObligationState.PENDING  # type: ignore[union-attr]
    expected = "the token's lifetime exceeds the 1 h this dashboard accepts (max_token_ttl_s)"
    assert (auth["operator"], auth["reason"]) == (None, expected)
    assert refused["reason"] == expected


@pytest.mark.asyncio
async def test_a_dashboard_accepts_tokens_as_long_lived_as_its_option_allows(
    tmp_path: Path,
) -> None:
    """With ``max_token_ttl_s`` set to the run's lifetime, the 12 h token a local run mints is
    accepted, and a token living longer still is refused naming that cap."""
    options = {"secrets": SECRETS, "max_token_ttl_s": 12 * 3600}
    async with running(tmp_path, **options) as stack:
        oid = stack.record("owed")
        token = mint_token("alice", SECRET, ttl_s=12 * 3600)
        longer = mint_token("alice", SECRET, ttl_s=13 * 3600)
        async with connect(stack.url) as ws:
            await receive(ws, "hello")
            assert (await ask(ws, {"type": "auth", "token": token}, "auth"))["operator"] == "alice"
            message = {"type": "abandon", "id": oid, "reason": "r", "token": token}
            assert (await ask(ws, message, "done"))["state"] == "abandoned"
            refused = await ask(ws, {"type": "auth", "token": longer}, "auth")
    assert refused["reason"] == (
        "the token's lifetime exceeds the 12 h this dashboard accepts (max_token_ttl_s)"
    )


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
        ("3600", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
    ids=["zero", "negative", "inf", "nan", "text", "bool", "none"],
)
def test_a_token_lifetime_cap_that_cannot_work_is_refused(
    tmp_path: Path, value: object, error: type[Exception]
) -> None:
    """``max_token_ttl_s`` must be a positive, finite number of seconds: anything else is
    refused with a typed error naming the option when the dashboard is made."""
    store = SQLiteStore(tmp_path / "x.db")
    try:
        with pytest.raises(error, match="max_token_ttl_s must be"):
            Dashboard(store, max_token_ttl_s=value)  # type: ignore[arg-type]
    finally:
        store.close()


def flags(rows: list[dict[str, Any]]) -> dict[str, bool]:
    """Each obligation row's id -> whether it is flagged as keeping failing."""
    return {row["id"]: row["keeps_failing"] for row in rows if row["kind"] == "obligation"}


@pytest.mark.asyncio
async def test_owed_replies_that_keep_failing_are_counted_and_flagged(tmp_path: Path) -> None:
    """A permanently refused reply counts as keeping failing in the snapshot and is flagged
    (with its error kind, last error and what it waits for) in the owed and latest rows and
    its history, while a transient failure with a retry due is listed as failed but not
    flagged."""
    async with running(tmp_path) as stack:
        refused, retried, fine = stack.record("long"), stack.record("soon"), stack.record("ok")
        stack.fail(refused, "message too long", ErrorKind.PERMANENT)
        stack.fail(retried, "connection timed out", ErrorKind.TRANSIENT)
        async with connect(stack.url) as ws:
            hello = await receive(ws, "hello")
            history = await ask(ws, {"type": "history", "id": refused}, "history")
            other = await ask(ws, {"type": "history", "id": retried}, "history")
    obligations = counts_of(hello)
    assert obligations["states"]["failed"] == 2
    assert (obligations["keep_failing"], obligations["keep_failing_exact"]) == (1, True)
    expected = {refused: True, retried: False, fine: False}
    assert flags(hello["obligations"]) == expected
    assert flags(hello["latest"]) == expected
    owed = {row["id"]: row for row in hello["obligations"]}
    failure = owed[refused]["failure"]
    assert (failure["kind"], failure["last_error"], failure["keeps_failing"]) == (
        "permanent",
        "message too long",
        True,
    )
    assert failure["retry_at"] is None
    assert failure["waits_for"].startswith("an operator")
    transient = owed[retried]["failure"]
    assert (transient["kind"], transient["keeps_failing"]) == ("transient", False)
    assert transient["retry_at"] is not None
    assert transient["waits_for"] == "a retry by the running gateway"
    assert owed[fine]["failure"] is None
    assert history["row"]["keeps_failing"] is True
    assert history["row"]["failure"] == failure
    assert other["row"]["keeps_failing"] is False


@pytest.mark.asyncio
async def test_a_reply_that_starts_failing_is_flagged_live_until_abandoned(tmp_path: Path) -> None:
    """A reply refused for good after the browser connected arrives flagged in the changes and
    the counts say 1 keeps failing; once an operator abandons it, its change is unflagged and
    the counts go back to 0."""
    async with running(tmp_path, secrets=SECRETS) as stack, connect(stack.url) as ws:
        hello = await receive(ws, "hello")
        assert counts_of(hello)["keep_failing"] == 0
        oid = stack.record("too long")
        stack.fail(oid, "message too long", ErrorKind.PERMANENT)
        changes = await receive(
            ws, "changes", lambda m: any(c["state"] == "failed" for c in m["changes"])
        )
        failed = [c for c in changes["changes"] if c["state"] == "failed"]
        assert [(c["id"], c["keeps_failing"]) for c in failed] == [(oid, True)]
        assert failed[0]["failure"]["last_error"] == "message too long"
        assert all(not c["keeps_failing"] for c in changes["changes"] if c["state"] != "failed")
        await receive(ws, "counts", lambda m: counts_of(m)["keep_failing"] == 1)
        token = mint_token("alice", SECRET)
        action = {"type": "abandon", "id": oid, "reason": "cannot be sent", "token": token}
        assert (await ask(ws, action, "done"))["state"] == "abandoned"
        abandoned = await receive(
            ws, "changes", lambda m: any(c["state"] == "abandoned" for c in m["changes"])
        )
        moved = abandoned["changes"][-1]
        assert (moved["id"], moved["keeps_failing"], moved["failure"]) == (oid, False, None)
        counts = await receive(ws, "counts", lambda m: counts_of(m)["states"]["abandoned"] == 1)
        assert counts_of(counts)["keep_failing"] == 0
