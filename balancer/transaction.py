"""transaction.py: an undo log over one Datapath's map writes, so that a config applies whole or not at all.

balancer/controller.py opens one per apply (`Datapath.transaction`); each undo is recorded before
its write, so that a rollback also undoes a write that failed halfway.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from balancer import _abi
from balancer.errors import DatapathError
from balancer.libbpf import Map
from balancer.maplayout import real_entry, settings_bytes, vip_entry, vip_key

if TYPE_CHECKING:
    from balancer.datapath import Datapath

Encap = _abi.Encap


class Transaction:
    """An undo log over one Datapath's writes; made by :meth:`Datapath.transaction`.

    Each undo is recorded before its write, so a write that fails halfway is undone too.
    ``crash_after_slots``: the process kills itself (SIGKILL) once that many ring slots are written,
    leaving a ring half-written as a crash would (suites/conformance/test_reliability.py).
    """

    def __init__(self, dp: Datapath, *, crash_after_slots: int | None = None) -> None:
        self._dp = dp
        self._undo: list[Callable[[], None]] = []
        self._crash_after = crash_after_slots
        self.ring_slots = 0  # ring slots written so far

    def put_settings(self, **kwargs: Any) -> None:
        """Write lb_settings (see settings_bytes for the arguments)."""
        self._put(self._dp.maps["lb_settings"], b"\0" * 4, settings_bytes(**kwargs))

    def put_real(self, real_id: int, address: str) -> None:
        self._put(self._dp.maps["lb_reals"], *real_entry(real_id, address))

    def put_entry(self, entry: tuple[str, bytes, bytes]) -> bool:
        """Write one (map, key, value) entry (balancer/routes.py) unless it holds it; whether it wrote."""
        name, key, value = entry
        m = self._dp.maps[name]
        if m.lookup(key) == value:
            return False
        self._put(m, key, value)
        return True

    def delete_entry(self, name: str, key: bytes) -> bool:
        m = self._dp.maps[name]
        old = m.lookup(key)
        if old is None:
            return False
        self._undo.append(lambda: _restore(m, key, old))
        m.delete(key)
        return True

    def del_real(self, real_id: int) -> None:
        """Mark a real id empty (lb_reals is an array: the entry stays, zeroed)."""
        self._put(self._dp.maps["lb_reals"], real_id.to_bytes(4, "little"), bytes(_abi.Real()))

    def put_vip(self, address: str, port: int, proto: str | int, *, vip_num: int, flags: int = 0,
                encap: int = Encap.IPIP) -> bool:
        """Write a VIP entry unless it holds that value already; whether it wrote."""
        key, meta = vip_entry(address, port, proto, vip_num, flags, encap)
        if self._dp.maps["lb_vips"].lookup(key) == meta:
            return False
        self._index_undo()
        self._put(self._dp.maps["lb_vips"], key, meta)
        self._undo.append(lambda: self._dp.unpublish_vips([key]))
        self._dp.sync_vip_index()
        return True

    def del_vip(self, address: str, port: int, proto: str | int) -> None:
        m = self._dp.maps["lb_vips"]
        key = vip_key(address, port, proto)
        old = m.lookup(key)
        if old is not None:
            self._index_undo()
            self._dp.unpublish_vips([key])
            self._undo.append(lambda: _restore(m, key, old))
            m.delete(key)
            self._undo.append(lambda: self._dp.unpublish_vips([key]))
            self._dp.sync_vip_index()

    def _index_undo(self) -> None:
        """Before an lb_vips write: its undo re-syncs lb_vip_index after lb_vips is restored. The write
        adds an undo that unpublishes the key's slot, so the rollback runs: unpublish, restore, re-sync."""
        def resync() -> None:
            self._dp.sync_vip_index()

        self._undo.append(resync)

    def write_ring_slots(self, vip_num: int, slots: npt.NDArray[Any], new_ring: npt.NDArray[Any]) -> None:
        """Set ``slots`` of a VIP's ring to their values in ``new_ring`` (a whole ring)."""
        dp = self._dp
        before = dp.ring_array(vip_num)[slots]
        self._undo.append(lambda: dp.write_ring_slots(vip_num, slots, before))
        if self._crash_after is not None and self.ring_slots + len(slots) > self._crash_after:
            part = slots[:self._crash_after - self.ring_slots]
            dp.write_ring_slots(vip_num, part, new_ring[part])
            os.kill(os.getpid(), signal.SIGKILL)
        dp.write_ring_slots(vip_num, slots, new_ring[slots])
        self.ring_slots += len(slots)

    def rollback(self) -> None:
        """Restore every replaced value, newest first; best effort past a failing restore."""
        for undo in reversed(self._undo):
            try:
                undo()
            except DatapathError:
                continue
        self._undo.clear()

    def _put(self, m: Map, key: bytes, value: bytes) -> None:
        old = m.lookup(key)
        self._undo.append(lambda: _restore(m, key, old))
        m.update(key, value)


def _restore(m: Map, key: bytes, old: bytes | None) -> None:
    if old is None:
        m.delete(key)
    else:
        m.update(key, old)
