"""The one free-port helper: the kernel's port, a free block in a range, a held port, the test range override."""

from __future__ import annotations

import socket

import pytest

from sgl_seat.netports import PORTS_ENV, any_free_port, free_block, held, is_free, port_range, random_starts


def test_a_kernel_port_is_free_once_returned() -> None:
    port = any_free_port()
    assert 0 < port < 65536
    assert is_free(port, reuse=False)


def test_a_held_port_is_not_free_and_is_again_after() -> None:
    with held(listen=True) as port:
        assert not is_free(port) and not is_free(port, reuse=False)
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # listening: a client connects
    assert is_free(port)


def test_a_held_port_that_does_not_listen_refuses_connections() -> None:
    with held() as port, pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)


def test_free_block_skips_a_start_with_one_port_taken_or_avoided() -> None:
    with held() as port:
        # A block whose second port is held is passed over; the next start is taken.
        assert free_block([port - 1, port + 1], (0, 1)) == port + 1
        assert free_block([port], (0,)) is None
    assert free_block([port - 1, port + 1], (0, 1), avoid={port + 2}) == port - 1
    assert free_block([port], avoid={port}) is None
    assert free_block([]) is None


def test_random_starts_stay_in_the_range() -> None:
    starts = list(random_starts(32000, 32003, tries=200))
    assert len(starts) == 200 and set(starts) <= {32000, 32001, 32002, 32003}


def test_port_range_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORTS_ENV, raising=False)
    assert port_range((32000, 32767)) == (32000, 32767)
    monkeypatch.setenv(PORTS_ENV, "40000-40099")
    assert port_range((32000, 32767)) == (40000, 40099)
