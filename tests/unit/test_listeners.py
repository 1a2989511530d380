"""Which listener serves an address (issue 24: a `[::]` or `[::1]` squatter beside the engine's socket), and
the localhost that is scraped where its owner is checked. The attacks end to end:
tests/security/test_attack_sockets.py."""

import ipaddress as ip

from gpuwarden.engine.processes import serves
from gpuwarden.runtime.sockets import pinned


def test_the_listener_that_serves_each_address():
    v4, v6, any4, any6 = ip.ip_address("127.0.0.1"), ip.ip_address("::1"), ip.ip_address("0.0.0.0"), \
        ip.ip_address("::")
    assert serves(v4, [(any4, 1), (any6, 2)]) == {1}  # both bound: [::] is v6-only
    assert serves(v4, [(any6, 2)]) == {2}  # dual-stack [::] alone serves IPv4 too
    assert serves(v4, [(v4, 3), (any4, 1)]) == {3}  # the exact address first
    assert serves(v4, [(ip.ip_address("::ffff:127.0.0.1"), 4), (any4, 1)]) == {4}
    assert serves(v6, [(any4, 1), (v6, 5)]) == {5}
    assert serves(v6, [(any4, 1)]) == set()  # an IPv6 connection never reaches 0.0.0.0
    assert serves(v4, [(v6, 5)]) == set()


def test_localhost_is_scraped_where_its_owner_is_checked():
    assert pinned("http://localhost:8000/metrics") == "http://127.0.0.1:8000/metrics"
    assert pinned("http://user:pw@LOCALHOST:8000/m") == "http://user:pw@127.0.0.1:8000/m"
    assert pinned("http://[::1]:8000/metrics") == "http://[::1]:8000/metrics"
    assert pinned("https://engine.example:443/metrics") == "https://engine.example:443/metrics"
