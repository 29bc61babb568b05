"""sess4sim.py: the IPv4 session sets' insert rules simulated (bpf/include/session4.h; architecture.md, decisions).

2^19 sets of 4 ways, two candidate sets per flow as the datapath picks them; `python3 sess4sim.py 4,3` prints,
per rule (e_min: the empty ways a first set needs to take a new flow without reading the second), the fill
at the first displacement, the share displaced and of inserts reading both sets up to each fill, and the
established sessions a flood of new flows displaces."""
import random
import sys

W = 4
SETS = 1 << 19
MASK = SETS - 1
SHIFT = 32 - 19
MIX = 0x9e3779b1


def sets_of(h):
    a = h & MASK
    b = ((h * MIX) & 0xffffffff) >> SHIFT & MASK
    if b == a:
        b = a ^ 1
    return a, b


def run(e_min, seed, flows, established=0, marks=()):
    """Insert `flows` new flows (the first `established` of them tagged); e_min: the first set's empty ways
    that let an insert skip reading the second set (4: the emptier-set rule, 1: first while free)."""
    rnd = random.Random(seed)
    t = [[] for _ in range(SETS)]  # per set: list of (time, flow id)
    over = bytearray(SETS)
    displaced = 0
    est_lost = 0
    both = 0
    out = {}
    for n in range(flows):
        a, b = sets_of(rnd.getrandbits(32))
        sa = t[a]
        ea = W - len(sa)
        read2 = over[a] or ea < e_min
        both += read2
        if ea >= e_min:
            sa.append((n, n))
        else:
            sb = t[b]
            eb = W - len(sb)
            if ea and ea >= eb:
                sa.append((n, n))
            elif eb:
                sb.append((n, n))
                over[a] = 1
            else:
                # the oldest of the 8
                oa = min(sa)
                ob = min(sb)
                if ob < oa:
                    sb.remove(ob)
                    sb.append((n, n))
                    over[a] = 1
                    victim = ob
                else:
                    sa.remove(oa)
                    sa.append((n, n))
                    victim = oa
                displaced += 1
                if victim[1] < established:
                    est_lost += 1
        done = n + 1
        for m in marks:
            if done == int(m * SETS * W):
                out[m] = (displaced, both)
    return displaced, est_lost, both, out


def first_displacement(e_min, seed):
    rnd = random.Random(seed)
    t = [0] * SETS
    for n in range(SETS * W):
        a, b = sets_of(rnd.getrandbits(32))
        if W - t[a] >= e_min:
            t[a] += 1
        elif t[a] < W and t[a] <= t[b]:
            t[a] += 1
        elif t[b] < W:
            t[b] += 1
        else:
            return n / (SETS * W)
    return 1.0


if __name__ == "__main__":
    rules = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4, 3, 2, 1]
    for e_min in rules:
        for seed in (1, 2):
            fd = first_displacement(e_min, seed)
            marks = (0.25, 0.5, 0.75, 1.0)
            disp, _, _, out = run(e_min, seed, SETS * W, marks=marks)
            _, lost, _, _ = run(e_min, seed + 100, 100_000 + 1_000_000, established=100_000)
            fill = " ".join(f"{int(m*100)}%: displaced {out[m][0] / (m*SETS*W) * 100:.2f}% both-read {out[m][1] / (m*SETS*W) * 100:.1f}%"
                            for m in marks)
            print(f"e_min {e_min} seed {seed}: first displacement at {fd*100:.1f}% full; {fill}; "
                  f"flood (1e5 est + 1e6 new) lost {lost}", flush=True)
