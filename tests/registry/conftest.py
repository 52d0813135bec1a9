"""Registries for the tests: each started on an ephemeral port in a temporary directory and
stopped afterwards, even when the test fails."""
from __future__ import annotations

import sys

import pytest

# confluent-kafka's JSON serdes import jsonschema, which imports rfc3987_syntax when installed (it is,
# with jupyterlab): seconds of CPU to build a grammar for IRI format checks no test here uses. The
# registry's own process skips it the same way (statekit/registry/__main__.py).
sys.modules.setdefault("rfc3987_syntax", None)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """One registry for a test module (tests use subjects of their own)."""
    from statekit import registry as registry_mod

    handle = registry_mod.start(dir=str(tmp_path_factory.mktemp("registry")))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def fresh_registry(tmp_path):
    """A registry of one test's own (global settings, restarts)."""
    from statekit import registry as registry_mod

    handle = registry_mod.start(dir=str(tmp_path / "registry"))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def client(registry):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": registry.url})
