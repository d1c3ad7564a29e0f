"""Where the node cannot keep the client's address: the node's address, one problem line, and
the status saying why; and the flag that turns it off."""

from __future__ import annotations

import asyncio

from support.proxy_loopback import apply_states, greeting, on_uvloop, running_proxier, web

from kubeport.proxy import proxier as proxier_module
from kubeport.proxy.clientaddress import Keep
from kubeport.proxy.host.replies import ClientReplies, NodeLinks

NO_PRIVILEGE = "IP_TRANSPARENT: Operation not permitted (needs CAP_NET_ADMIN)"


@on_uvloop
async def test_without_the_privilege__the_node_address__one_problem__served(monkeypatch):
    monkeypatch.setattr(proxier_module, "transparent_allowed", lambda: NO_PRIVILEGE)
    async with running_proxier() as (proxier, _, _, backends):
        port = await backends.tcp("b1")
        await apply_states(proxier, [web(port, vip="127.0.0.48")])
        assert await greeting("127.0.0.48") == "b1"
        assert proxier.client_address == f"node: {NO_PRIVILEGE}"
        assert [p for p in proxier.problems if "client's" in p] == [
            f"endpoints see the node's address, not the client's ({NO_PRIVILEGE})"]
        assert {rule.kind: proxier._route_for(rule).keep for rule in proxier.rules.values()} == {
            rule.kind: Keep.NEVER for rule in proxier.rules.values()}


@on_uvloop
async def test_the_flag_off__no_problem_line():
    async with running_proxier(keep_client_address=False) as (proxier, _, _, _):
        assert proxier.client_address == "node: --no-keep-client-address"
        assert not [p for p in proxier.problems if "client's" in p]


@on_uvloop
async def test_able__the_client_address_is_kept():
    async with running_proxier() as (proxier, _, _, _):
        assert proxier.client_address == "client"


def test_replies_without_nft__a_problem_not_an_exception(monkeypatch):
    monkeypatch.setattr("kubeport.proxy.host.replies.shutil.which", lambda name: None)
    replies = ClientReplies()
    asyncio.run(replies.start(NodeLinks((), ())))
    assert not replies.enabled and replies.problem == "nft (nftables) not found"


def test_replies_without_the_privilege(monkeypatch):
    monkeypatch.setattr("kubeport.proxy.host.replies.transparent_allowed", lambda: NO_PRIVILEGE)
    replies = ClientReplies()
    asyncio.run(replies.start(NodeLinks((), ())))
    assert replies.problem == NO_PRIVILEGE

