"""Tests that pin the public surface of the statecore, stores and relay packages."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]

EXPECTED_ALL: dict[str, list[str]] = {
    "statecore": [
        "AsyncLedger",
        "AsyncTimers",
        "Audit",
        "BatchStore",
        "Claim",
        "Clock",
        "Creation",
        "DECLARED_LIFECYCLES",
        "Deadline",
        "DeclarationError",
        "Due",
        "EntityKind",
        "ErrorKind",
        "FakeClock",
        "Field",
        "Fired",
        "Incarnation",
        "Index",
        "InvalidTransition",
        "Ledger",
        "LedgerPolicy",
        "Lifecycle",
        "LivenessCache",
        "Migration",
        "Move",
        "OBLIGATION",
        "OBLIGATION_KIND",
        "Obligation",
        "ObligationState",
        "Owner",
        "ProcessProbe",
        "PsutilProbe",
        "RECONNECTED_MARKER",
        "RECOVERED_MARKER",
        "Row",
        "StaleState",
        "StateMachine",
        "StatecoreError",
        "Store",
        "StoreError",
        "SystemClock",
        "Timer",
        "Timers",
        "Transition",
        "TransitionRecord",
        "UnknownEntity",
        "compute_obligation_id",
        "owner_alive",
    ],
    "statecore.gateway": [
        "AdapterAbilities",
        "DELEGATION",
        "DELEGATION_KIND",
        "Delegation",
        "DelegationState",
        "Delegations",
        "Gateway",
        "LongReplies",
        "Message",
        "MessageLimit",
        "PlatformAdapter",
        "Route",
        "RouteVerdict",
        "RoutingOrigin",
        "SESSION",
        "SESSION_KIND",
        "SendResult",
        "Session",
        "SessionState",
        "SessionStore",
        "Turn",
        "USER_BOUNDARY_END_REASONS",
        "resolve_route",
    ],
    "stores": [
        "InMemoryStore",
        "PostgresStore",
        "SQLiteStore",
        "open_store",
    ],
    "relay": [
        "AuthError",
        "CONTRACT_VERSION",
        "CapabilityDescriptor",
        "ChatRoute",
        "Connector",
        "ContractVersionError",
        "EventSource",
        "InboundEvent",
        "LoopbackPlatform",
        "PlatformDriver",
        "ProtocolError",
        "RelayAdapter",
        "RelayBroken",
        "RelayClosed",
        "RequestOutcome",
        "RequestResult",
        "SEND_PATH_DEGRADED",
        "StoreBufferDedupe",
        "TRANSPORT",
        "TransportState",
        "WebSocketRelayTransport",
        "mint_token",
        "relay_url",
        "verify_token",
    ],
}

PACKAGES = sorted(EXPECTED_ALL)


def _package(name: str) -> ModuleType:
    return importlib.import_module(name)


def test_expected_lists_are_sorted() -> None:
    """The pinned __all__ literals in this file are themselves sorted (so diffs stay readable)."""
    for names in EXPECTED_ALL.values():
        assert names == sorted(names)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_pinned(package: str) -> None:
    """Each package's __all__ holds exactly the pinned names, with no duplicates."""
    exported = list(_package(package).__all__)
    assert sorted(exported) == EXPECTED_ALL[package]
    assert len(exported) == len(set(exported))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_is_importable(package: str) -> None:
    """Every name in a package's __all__ can be imported from the package."""
    module = _package(package)
    for name in module.__all__:
        namespace: dict[str, object] = {}
        exec(f"from {package} import {name}", namespace)
        assert namespace[name] is getattr(module, name)


def test_star_import_gives_exactly_all() -> None:
    """'from statecore import *' binds exactly the names in statecore.__all__."""
    namespace: dict[str, object] = {}
    exec("from statecore import *", namespace)
    namespace.pop("__builtins__", None)
    assert sorted(namespace) == EXPECTED_ALL["statecore"]


@pytest.mark.parametrize("package", PACKAGES)
def test_package_ships_py_typed(package: str) -> None:
    """Each package directory contains a py.typed marker (PEP 561)."""
    module_file = _package(package).__file__
    assert module_file is not None
    assert (Path(module_file).parent / "py.typed").is_file()


def test_statecore_imports_no_io_drivers() -> None:
    """Importing statecore loads neither sqlite3 nor websockets (the core performs no I/O)."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import statecore, sys; print('sqlite3' in sys.modules, 'websockets' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_every_public_name_has_one_documented_home() -> None:
    """No name is exported by two packages: each public name is imported from exactly one
    package (its defining submodule is an implementation detail)."""
    homes: dict[str, list[str]] = {}
    for package in PACKAGES:
        for name in _package(package).__all__:
            homes.setdefault(name, []).append(package)
    shared = {name: where for name, where in homes.items() if len(where) > 1}
    assert shared == {}
