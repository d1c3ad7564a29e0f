"""The connection caps TCP DNS and the HTTP servers share (kubeport/lib/admission.py): at a cap
the connection idle longest makes room (at the per-client cap, the client's own); none idle,
the new one is refused."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kubeport.lib.admission import ConnectionAdmission


@dataclass(eq=False)
class Conn:
    name: str
    client: str
    last_activity: float
    idle: bool = True
    evicted: bool = False

    def evict(self) -> None:
        self.evicted = True


def spec(text: str) -> list[Conn]:
    """"a1:5 a2:3! b1:4": client a's conn 1 last active at 5, client a's 2 busy (!), ..."""
    conns = []
    for item in text.split():
        busy = item.endswith("!")
        name, _, when = item.rstrip("!").partition(":")
        conns.append(Conn(name, name[0], float(when), idle=not busy))
    return conns


@pytest.mark.parametrize("held, new, limit, per_client, admitted, evicted", [
    pytest.param("a1:1 b1:2", "c1:9", 3, 3, True, None, id="below_the_caps"),
    pytest.param("a1:1 b1:2 c1:3", "d1:9", 3, 3, True, "a1", id="global_cap__idle_longest_of_anyone"),
    pytest.param("a1:1! b1:2 c1:3", "d1:9", 3, 3, True, "b1", id="global_cap__busy_ones_are_kept"),
    pytest.param("a1:1! b1:2! c1:3!", "d1:9", 3, 3, False, None, id="global_cap__none_idle__refused"),
    pytest.param("b1:1 a1:2 a2:3", "a3:9", 9, 2, True, "a1", id="per_client_cap__its_own_idle_longest"),
    pytest.param("b1:1 a1:2! a2:3!", "a3:9", 9, 2, False, None, id="per_client_cap__own_busy__refused"),
    pytest.param("a1:1 a2:2 b1:3", "a3:9", 3, 2, True, "a1", id="both_caps__the_clients_own_first"),
])
def test_admit(held, new, limit, per_client, admitted, evicted):
    counted = {"rejected": 0, "evicted": 0}
    caps = ConnectionAdmission(limit, per_client, rejected=lambda: counted.__setitem__("rejected", 1),
                               evicted=lambda: counted.__setitem__("evicted", 1))
    conns = spec(held)
    for conn in conns:
        assert caps.admit(conn)
    [incoming] = spec(new)
    assert caps.admit(incoming) is admitted
    assert [c.name for c in conns if c.evicted] == ([evicted] if evicted else [])
    assert counted == {"rejected": int(not admitted), "evicted": int(evicted is not None)}
    assert (incoming in caps.open) is admitted
    assert len(caps) == len(conns) + admitted - (evicted is not None)


def test_a_discarded_connection_frees_its_clients_share():
    caps = ConnectionAdmission(9, 1)
    [first, second] = spec("a1:1! a2:2")
    assert caps.admit(first) and not caps.admit(second)
    caps.discard(first)
    caps.discard(first)  # its close, after an eviction already took it out: nothing more
    assert caps.admit(second) and list(caps) == [second]
