"""balancer/validate.py: the checks the four file formats share, each failing with the format's error."""

from __future__ import annotations

import ipaddress
import math

import pytest

from balancer.validate import Reader, join


class Bad(Exception):
    """The error a format would raise: path, value and expectation, kept apart for the asserts."""

    def __init__(self, path: str, value: object, expected: str) -> None:
        super().__init__(f"{path} must be {expected} but got {value!r}")
        self.path, self.value, self.expected = path, value, expected


check = Reader(Bad)


@pytest.mark.parametrize(("path", "key", "joined"), [
    ("", "vips", "vips"),
    ("vips", "[2]", "vips[2]"),
    ("vips[2]", "port", "vips[2].port"),
    ("vips[2]", "", "vips[2]"),
])  # fmt: skip
def test_key_paths_read_as_in_the_file(path: str, key: str, joined: str) -> None:
    assert join(path, key) == joined


@pytest.mark.parametrize(("value", "expected"), [
    (True, "an integer 1..10"),      # a bool is an int to Python, never to a config file
    ("3", "an integer 1..10"),
    (0, "1..10 (range)"),
    (11, "1..10 (range)"),
])  # fmt: skip
def test_integer_refuses_bools_strings_and_out_of_range(value: object, expected: str) -> None:
    with pytest.raises(Bad) as err:
        check.integer(value, "a.b", 1, 10, range_expected="1..10 (range)")
    assert (err.value.path, err.value.value, err.value.expected) == ("a.b", value, expected)
    assert check.integer(10, "a.b", 1, 10) == 10


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_number_must_be_finite(value: float) -> None:
    with pytest.raises(Bad) as err:
        check.number(value, "t", finite="a finite number")
    assert err.value.expected == "a finite number"
    assert check.number(2, "t") == 2.0 and isinstance(check.number(2, "t"), float)
    with pytest.raises(Bad):
        check.number(False, "t")


def test_unknown_keys_name_the_first_one_and_list_the_known() -> None:
    with pytest.raises(Bad) as err:
        check.known_keys({"port": 1, "colour": "red"}, ("port", "proto"), "vips[0]")
    assert str(err.value) == "vips[0].colour must be absent (known keys: port, proto) but got 'red'"
    check.known_keys({"port": 1}, ("port", "proto"), "vips[0]")


def test_a_format_can_word_unknown_keys_its_own_way() -> None:
    def unknown(path: str, value: object, known: object) -> Bad:
        return Bad(path, value, "a known key")

    with pytest.raises(Bad, match="x must be a known key"):
        Reader(Bad, unknown).known_keys({"x": 1}, ("y",), "")


def test_strings_choices_and_emptiness() -> None:
    assert check.string("tcp", "p", choices=("tcp", "udp")) == "tcp"
    with pytest.raises(Bad, match="p must be one of 'tcp', 'udp' but got 'sctp'"):
        check.string("sctp", "p", choices=("tcp", "udp"))
    with pytest.raises(Bad, match="s must be a non-empty string but got ''"):
        check.string("", "s", empty=False)
    with pytest.raises(Bad, match="s must be a string but got 5"):
        check.string(5, "s")


def test_addresses_networks_interfaces_and_macs() -> None:
    assert check.address("2001:db8::1", "a") == ipaddress.ip_address("2001:db8::1")
    with pytest.raises(Bad):
        check.address(5, "a")  # ipaddress would take the integer; a file holds a string
    with pytest.raises(Bad):
        check.network("198.51.100.1/25", "n")  # host bits set
    assert check.network("198.51.100.1/25", "n", strict=False) == ipaddress.ip_network("198.51.100.0/25")
    with pytest.raises(Bad):
        check.network("2001:db8::/64", "n", version=4)
    with pytest.raises(Bad):
        check.interface("192.0.2.1", "i")  # no prefix length
    assert check.mac("02:AA:00:00:00:01", "m") == "02:aa:00:00:00:01"
    with pytest.raises(Bad):
        check.mac("02:aa:00:00:00", "m")


def test_shapes() -> None:
    assert check.table({"a": 1}, "t") == {"a": 1}
    with pytest.raises(Bad, match="t must be a table but got"):
        check.table([1], "t")
    with pytest.raises(Bad, match="l must be an array but got"):
        check.array({"a": 1}, "l")
    with pytest.raises(Bad, match="b must be true or false but got 1"):
        check.boolean(1, "b")
