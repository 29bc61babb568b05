"""sess4.py: IPv4 sessions found and written in the datapath's sets (bpf/include/session4.h) as its own
writer writes them, for tests that set a session up or change one in place.

The controller only reads and empties ways (Datapath.sessions, flush_sessions); a test that needs a way
written picks the set and way itself. A way written into a set that is not one of its flow's two (the
datapath's flow hash decides them) is seen by the controller's walk but never by a lookup.

    set_, way = find_way(dp, flow)
    write_way(dp, set_, way, flow, _abi.Session(real_id=2, hash=0x1234))
"""

from __future__ import annotations

import numpy as np

from balancer import _abi
from balancer.datapath import Datapath
from balancer.maplayout import (
    SESS4_CHECK,
    SESS4_KEY_WORDS,
    SESS4_OVERFLOW,
    SESS4_PROTO,
    SESS4_SESSION_WORDS,
    SESS4_SESSIONS_AT,
    SESS4_SET_WORDS,
    SESS4_TAG_WORD,
    SESS4_WAYS,
    SESSION_SETS,
    sess4_check,
    sess4_held,
    sess4_key,
)


def find_way(dp: Datapath, flow: _abi.Flow) -> tuple[int, int]:
    """(set, way) of the one way of the sets that holds the IPv4 flow's key (maplayout.sess4_held)."""
    key = _abi.Sess4Key.from_buffer_copy(sess4_key(flow))
    words = dp.maps[SESSION_SETS].mmap_words()
    keys = words[:, :SESS4_WAYS * SESS4_KEY_WORDS].reshape(-1, SESS4_WAYS, SESS4_KEY_WORDS)
    hit = (keys[..., 0] == key.src) & (keys[..., 1] == key.dst) & (keys[..., 2] == key.ports) & \
        (keys[..., SESS4_TAG_WORD] & SESS4_PROTO == key.tag) & sess4_held(words)
    found = [(int(s), int(w)) for s, w in zip(*np.nonzero(hit), strict=True)]
    del words, keys
    assert len(found) == 1, f"the flow's key is in {len(found)} ways of {SESSION_SETS}: {found}"
    return found[0]


def write_way(dp: Datapath, set_: int, way: int, flow: _abi.Flow, sess: _abi.Session) -> None:
    """Writes the IPv4 flow's session into (set_, way) in the datapath writer's order: the "being
    written" check, then key and session, then the final tag (protocol and sess4_check) last; way 0's
    overflow bit kept."""
    key = _abi.Sess4Key.from_buffer_copy(sess4_key(flow))
    key_at = set_ * SESS4_SET_WORDS + way * SESS4_KEY_WORDS
    tag_at = key_at + SESS4_TAG_WORD
    sess_at = set_ * SESS4_SET_WORDS + SESS4_SESSIONS_AT + way * SESS4_SESSION_WORDS
    table = dp.maps[SESSION_SETS]
    with table.mmap_view("I") as words, table.mmap_view("Q") as quads:
        overflow = words[tag_at] & SESS4_OVERFLOW
        words[tag_at] = overflow | SESS4_CHECK
        words[key_at], words[key_at + 1], words[key_at + 2] = key.src, key.dst, key.ports
        words[sess_at], words[sess_at + 1] = sess.real_id, sess.hash
        quads[(sess_at + 2) // 2] = sess.atime_ns
        words[tag_at] = overflow | key.tag | sess4_check(key.src, key.dst, key.ports, key.tag, sess.real_id,
                                                         sess.hash)
