import socket

from harness.launch.ranks.ports import is_addr_in_use, pick_free_port


def test_picked_port_can_be_bound():
    port = pick_free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen(1)


def test_picked_ports_differ_while_held():
    # A port somebody listens on is never handed out.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        taken = held.getsockname()[1]
        assert all(pick_free_port() != taken for _ in range(20))


def test_addr_in_use_recognised_in_rank_output():
    assert is_addr_in_use("RuntimeError: The server socket has failed to listen on any local "
                          "network address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, "
                          "message: address already in use")
    assert is_addr_in_use("OSError: [Errno 98] Address already in use")
    assert not is_addr_in_use("RuntimeError: injected fault: crash at step 2")
