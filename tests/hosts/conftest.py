"""The hosts tier: fake hosts on this box (tests/hosts/harness.py), skipped where none can be made."""

from __future__ import annotations

import pytest

from tests.hosts.harness import Hosts, unavailable


@pytest.fixture
def make_hosts():
    """``make_hosts(["a", "b"])``: hosts torn down after the test, and checked to leave nothing."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    made: list[Hosts] = []

    def make(names, **kw) -> Hosts:
        hosts = Hosts(names, **kw).__enter__()
        made.append(hosts)
        return hosts

    yield make
    left = []
    for hosts in made:
        hosts.close()
        left += hosts.leftovers()
    assert not left, f"the hosts' teardown left {left}"
