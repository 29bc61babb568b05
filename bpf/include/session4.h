/* session4.h: the IPv4 flows' session table: 128-byte sets of 4 ways, two candidate sets per flow.
 *
 * A set (struct lb_sess4_set) is a line of 4 keys and a line of their 4 sessions. A flow may live in its
 * first set (low bits of its flow hash) or its second (top bits of a product of it). A new flow takes an
 * empty way of its first set while that has SESS4_FIRST_FREE empty ways, without reading the second; else
 * an empty way of the emptier of its two sets (ties: the first), else the oldest of the 8 ways: a TCP way
 * ages from its insert, a UDP way from the time a hit last wrote back (session.h: within a sixteenth of the
 * timeout of its last packet). A flow that goes into its second set sets its first set's overflow bit
 * (way 0's tag, bit 31, with an atomic OR); a lookup reads the second set only when that bit is set. The
 * bit is never cleared (a flush of way 0 keeps it too): a set once overflowed sends every later miss of its
 * flows to the second set too.
 *
 * Torn reads: the tag's check is a checksum of the way's content (key, protocol, real, hash; sess4_check,
 * and balancer/maplayout.py's twin). A reader takes a way only when the check of what it read agrees, so a
 * way read while a writer — or two writers on two CPUs at once — changed it is a miss, not another flow's
 * real. A writer still stores "being written" first (not empty: no other CPU picks the way) and the tag
 * last. Way 0's tag shares its 64-bit word with the ports and is written by 64-bit atomic AND / OR
 * (the only atomics besides add that this clang has without -mcpu=v3), so that a writer of way 0 keeps
 * the overflow bit another CPU may be setting; the other ways' tags are plain stores, and empty ways are
 * filled from way 3 down (the lookup's order too), so way 0 is the last a set fills.
 */
#ifndef L4LAB_SESSION4_H
#define L4LAB_SESSION4_H

#include "maps.h"

enum sess4_consts {
	SESS4_WRITING = LB_SESS4_CHECK,   /* a tag's check while its way is being written */
	SESS4_NO_WAY = 0xff,              /* struct sess4_slot: no way chosen */
	SESS4_MIX = 0x9e3779b1,           /* the second set's multiplier (Fibonacci hashing of the flow hash) */
	SESS4_CHECK_SHIFT = 8,
	SESS4_EMPTY = (1 << LB_SESS4_WAYS) - 1, /* sess4_miss()'s first_scan: the first set's empty ways ... */
	SESS4_CHOOSE = 1 << LB_SESS4_WAYS,      /* ... and whether the packet may insert */
	/* A first set with this many empty ways takes a new flow without a read of the second set: 3 of 4
	 * reads it for a quarter as many inserts as 4, at a displaced share close to 4's (architecture.md). */
	SESS4_FIRST_FREE = 3,
};

/* Where a flow's session is (a hit) or goes (a miss that may insert): chosen by the lookup, written by
 * the insert without a second scan. */
struct sess4_slot {
	/* Indices, not pointers: sess4_miss(), a global function, writes them (the insert looks the sets up). */
	__u32 first; /* the flow's first set, whose overflow bit a move into the second set sets */
	__u32 set;   /* the chosen way's set */
	/* Written and read as memory (sess4_put, sess4_get), at offsets that are no 8-byte slot's start: the
	 * verifier keeps bytes there, not values, and walks the code after the lookup once rather than once
	 * per way (a constant on each path; architecture.md, decisions). */
	__u8 pad0;
	__u8 way;     /* the chosen way, SESS4_NO_WAY for none */
	__u8 second;  /* the chosen set is the flow's second, reached by a miss: set the first's bit */
	__u8 pad[5];
};

static __always_inline void sess4_put(__u8 *field, __u32 value)
{
	*(volatile __u8 *)field = value;
}

static __always_inline __u32 sess4_get(const __u8 *field)
{
	return *(const volatile __u8 *)field;
}

#define sess4_barrier() asm volatile("" ::: "memory")

static __always_inline __u32 sess4_read(const __u32 *p)
{
	return *(const volatile __u32 *)p;
}

/* What a scan of one set's keys line found: the flow's way (or -1) with the tag read before its key, a
 * bit per empty way, and way 0's raw tag (the overflow bit). The empty ways are counted without a branch:
 * the verifier walks what follows once, not once per count. */
struct sess4_scan {
	int hit;
	__u32 tag;
	__u32 empty;
	__u32 tag0;
};

static __always_inline void sess4_scan_set(struct sess4_scan *r, struct lb_sess4_set *set, const struct lb_flow *key)
{
	int i;

	r->hit = -1;
	r->tag = 0;
	r->empty = 0;
	r->tag0 = 0;
#pragma unroll
	for (i = LB_SESS4_WAYS - 1; i >= 0; i--) {
		__u32 tag = sess4_read(&set->keys[i].tag);

		if (i == 0)
			r->tag0 = tag;
		tag &= ~(__u32)LB_SESS4_OVERFLOW;
		sess4_barrier(); /* the key after its tag */
		r->empty |= (((tag & LB_SESS4_CHECK) - 1) >> 31) << i; /* check 0: empty (and proto 0: no match) */
		/* the flow's words read from its key each time: fewer values live across the second lookup */
		if ((tag & LB_SESS4_PROTO) == key->proto && set->keys[i].src == key->src[0] &&
		    set->keys[i].dst == key->dst[0] && set->keys[i].ports == *(const __u32 *)&key->sport) {
			r->hit = i;
			r->tag = tag;
			return;
		}
	}
}

static __always_inline __u32 sess4_count(__u32 empty)
{
	return (empty & 1) + (empty >> 1 & 1) + (empty >> 2 & 1) + (empty >> 3 & 1);
}

/* The highest empty way (sets fill from way 3 down; way 0, whose tag holds the overflow bit, last). */
static __always_inline __u32 sess4_pick(__u32 empty)
{
	return empty & 8 ? 3 : empty & 4 ? 2 : empty & 2 ? 1 : 0;
}

/* A way's check: a checksum of its key, protocol, real and hash, in the tag's check bits, never 0 (empty)
 * nor SESS4_WRITING. Multiplies mix every input bit into the high bits the check keeps. Inline: as a
 * global function it cost a session hit about 5 % (architecture.md, decisions). */
static __always_inline __u32 sess4_check_words(__u32 src, __u32 dst, __u32 ports, __u32 real_proto, __u32 hash)
{
	__u32 x = src * 0x9e3779b1u ^ dst * 0x85ebca77u ^ ports * 0xc2b2ae3du ^ real_proto * 0x27d4eb2fu ^
		  hash * 0x165667b1u;

	x ^= x >> 15;
	x = (x >> 1) & LB_SESS4_CHECK;
	if (!x)
		return 1 << SESS4_CHECK_SHIFT;
	if (x == SESS4_WRITING)
		return SESS4_WRITING ^ (1 << SESS4_CHECK_SHIFT);
	return x;
}

static __always_inline __u32 sess4_check(const struct lb_flow *key, __u32 real_id, __u32 hash)
{
	return sess4_check_words(key->src[0], key->dst[0], *(const __u32 *)&key->sport,
				 real_id ^ (__u32)key->proto << 24, hash);
}

/* A way index bounded by a mask where it is used. The barrier keeps the compiler from dropping the mask
 * after an earlier check: the 6.1 verifier (Debian 12's kernel) loses such a check's bounds when the
 * index is spilled and read back, and rejects the program. */
static __always_inline __u32 sess4_way(__u32 way)
{
	asm volatile("" : "+r"(way));
	return way & (LB_SESS4_WAYS - 1);
}

/* The hit's real, hash and time copied out; 0 when they and the flow's key do not give the tag's check
 * (a way torn by a writer). */
static __always_inline int sess4_copy(struct lb_sess4_set *set, __u32 way, __u32 tag, const struct lb_flow *key,
				      struct lb_session *out)
{
	if (way >= LB_SESS4_WAYS)
		return 0;
	way = sess4_way(way);
	sess4_barrier();
	out->real_id = set->sess[way].real_id;
	out->hash = set->sess[way].hash;
	out->atime_ns = set->sess[way].atime_ns;
	return sess4_check(key, out->real_id, out->hash) == (tag & LB_SESS4_CHECK);
}

/* The oldest of a set's 4 ways (their sessions line), if older than *oldest. */
static __always_inline int sess4_oldest(struct lb_sess4_set *set, __u64 *oldest)
{
	int i, found = -1;

#pragma unroll
	for (i = LB_SESS4_WAYS - 1; i >= 0; i--) {
		__u64 t = set->sess[i].atime_ns;

		if (t < *oldest) {
			*oldest = t;
			found = i;
		}
	}
	return found;
}

/* Keeps the way a lookup found or chose, for the insert (`record`: a constant, 0 for ICMP errors). */
static __always_inline void sess4_take(struct sess4_slot *slot, const int record, __u32 set, __u32 way,
				       __u32 second)
{
	if (!record)
		return;
	slot->set = set;
	sess4_put(&slot->way, way);
	sess4_put(&slot->second, second);
}

/* A hit's session, for a UDP touch: at the way read back from the slot (one pointer for every way). An
 * ICMP error (`record` 0) touches nothing: any non-NULL pointer says "hit". */
static __always_inline struct lb_session *sess4_hit(struct sess4_slot *slot, const int record, struct lb_sess4_set *set)
{
	if (!record)
		return &set->sess[0];
	return &set->sess[sess4_get(&slot->way) & (LB_SESS4_WAYS - 1)];
}

/* The flow's second set (its index): the top bits of a product of the flow hash, never its first. */
static __always_inline __u32 sess4_second(__u32 hash, __u32 first)
{
	__u32 idx = ((hash * (__u32)SESS4_MIX) >> cfg_sess4_shift) & cfg_sess4_mask;

	return idx == first ? first ^ (1 & cfg_sess4_mask) : idx;
}

/* After a miss in the flow's first set, whose scan's empty ways, overflow bit and SESS4_CHOOSE (the packet
 * may insert) are in `first_scan`: a hit in the second set, its session copied to *out and its way into
 * *slot (1); or 0, with the way the insert will take in *slot when choosing. A global function: the
 * verifier walks the second set and the choice once, not once for every path that misses. */
__noinline int sess4_miss(struct sess4_slot *slot, const struct lb_flow *key, __u32 hash, __u32 first_scan,
			  struct lb_session *out)
{
	struct lb_sess4_set *first, *second = NULL;
	struct sess4_scan b = { .hit = -1 };
	__u32 idx[2], empty = first_scan & SESS4_EMPTY;
	__u32 ea = sess4_count(empty), eb = 0;
	__u64 oldest;
	int oa, ob;

	if (!slot || !key || !out)
		return 0;
	idx[0] = hash & cfg_sess4_mask;
	if ((first_scan & LB_SESS4_OVERFLOW) || ((first_scan & SESS4_CHOOSE) && ea < SESS4_FIRST_FREE)) {
		idx[1] = sess4_second(hash, idx[0]);
		second = bpf_map_lookup_elem(&lb_sess4_sets, &idx[1]);
		if (second) {
			sess4_scan_set(&b, second, key);
			if (b.hit >= 0) {
				sess4_take(slot, 1, idx[1], b.hit, 0);
				return sess4_copy(second, b.hit, b.tag, key, out);
			}
			eb = sess4_count(b.empty);
		}
	}
	if (!(first_scan & SESS4_CHOOSE))
		return 0;
	if (ea >= SESS4_FIRST_FREE || (ea && ea >= eb)) {
		sess4_take(slot, 1, idx[0], sess4_pick(empty), 0);
		return 0;
	}
	if (eb) {
		sess4_take(slot, 1, idx[1], sess4_pick(b.empty), 1);
		return 0;
	}
	/* Both sets full: over the oldest of the 8 ways (the first set's on a tie). */
	oldest = ~0ULL;
	first = bpf_map_lookup_elem(&lb_sess4_sets, &idx[0]);
	oa = first ? sess4_oldest(first, &oldest) : -1;
	ob = second ? sess4_oldest(second, &oldest) : -1;
	if (ob >= 0)
		sess4_take(slot, 1, idx[1], ob, 1);
	else
		sess4_take(slot, 1, idx[0], oa, 0);
	return 0;
}

/* Looks an IPv4 flow up: its session's real, hash and time copied to *found and a pointer to it returned
 * (for a UDP touch), or NULL. `choose` (the packet may insert): a miss picks the way the insert will take,
 * into *slot; a hit leaves its own way there. A hit in the first set (most hits) calls no function but the
 * check; the rest is sess4_miss(), except for an ICMP error (`record` 0), which reads its second set here:
 * forward_steered()'s call chain has no stack left for another frame. */
static __always_inline struct lb_session *sess4_find(struct sess4_slot *slot, const struct lb_flow *key,
						     __u32 hash, int choose, const int record, struct lb_session *found)
{
	struct lb_sess4_set *first, *second;
	struct sess4_scan a, b;
	/* An ICMP error's two sets' keys, in one stack slot; the second starts as a scalar (not zero), so
	 * that the slot reads alike on every way out, whether the second set was looked up or not. The
	 * other packets look the first set up by the slot's copy of its key. */
	__u32 idx[2] = { hash & cfg_sess4_mask, hash };

	if (record) {
		slot->first = idx[0];
		sess4_take(slot, record, idx[0], SESS4_NO_WAY, 0);
		first = bpf_map_lookup_elem(&lb_sess4_sets, &slot->first);
	} else {
		first = bpf_map_lookup_elem(&lb_sess4_sets, &idx[0]);
	}
	if (!first)
		return NULL;
	sess4_scan_set(&a, first, key);
	if (a.hit >= 0) {
		sess4_take(slot, record, idx[0], a.hit, 0);
		if (!sess4_copy(first, a.hit, a.tag, key, found))
			return NULL;
		return sess4_hit(slot, record, first);
	}
	if (record) {
		if (!(a.tag0 & LB_SESS4_OVERFLOW) && !choose)
			return NULL;
		if (!sess4_miss(slot, key, hash, a.empty | (a.tag0 & LB_SESS4_OVERFLOW) | (choose ? SESS4_CHOOSE : 0),
				found))
			return NULL;
		second = bpf_map_lookup_elem(&lb_sess4_sets, &slot->set);
		return second ? sess4_hit(slot, record, second) : NULL;
	}
	if (!(a.tag0 & LB_SESS4_OVERFLOW))
		return NULL;
	idx[1] = sess4_second(hash, idx[0]);
	second = bpf_map_lookup_elem(&lb_sess4_sets, &idx[1]);
	if (!second)
		return NULL;
	sess4_scan_set(&b, second, key);
	if (b.hit < 0 || !sess4_copy(second, b.hit, b.tag, key, found))
		return NULL;
	return sess4_hit(slot, record, second);
}

/* Writes the flow's session into the way the lookup chose: "being written" first, the final tag last. */
static __always_inline void sess4_write(const struct sess4_slot *slot, const struct lb_flow *key, __u32 real_id,
					__u32 hash, __u64 now)
{
	__u32 way = sess4_get(&slot->way), check, tag;
	struct lb_sess4_set *set, *first;
	struct lb_sess4_key *k;
	struct lb_session *s;

	if (way >= LB_SESS4_WAYS)
		return;
	set = bpf_map_lookup_elem(&lb_sess4_sets, &slot->set);
	if (!set)
		return;
	first = sess4_get(&slot->second) ? bpf_map_lookup_elem(&lb_sess4_sets, &slot->first) : NULL;
	if (first) /* bit 31 of way 0's tag, the high half of its (ports, tag) word */
		__sync_fetch_and_or((__u64 *)&first->keys[0].ports, (__u64)LB_SESS4_OVERFLOW << 32);
	check = sess4_check(key, real_id, hash);
	tag = key->proto | check;
	way = sess4_way(way);
	k = &set->keys[way];
	s = &set->sess[way];
	if (way == 0)
		__sync_fetch_and_or((__u64 *)&k->ports, (__u64)(~(__u32)LB_SESS4_OVERFLOW) << 32);
	else
		*(volatile __u32 *)&k->tag = SESS4_WRITING;
	sess4_barrier();
	k->src = key->src[0];
	k->dst = key->dst[0];
	s->real_id = real_id;
	s->hash = hash;
	s->atime_ns = now;
	if (way == 0) {
		/* ports in the low half; the AND keeps the overflow bit and makes the rest the final tag */
		k->ports = *(const __u32 *)&key->sport;
		sess4_barrier();
		__sync_fetch_and_and((__u64 *)&k->ports,
				     ((__u64)(tag | LB_SESS4_OVERFLOW) << 32) | 0xffffffffULL);
		return;
	}
	k->ports = *(const __u32 *)&key->sport;
	sess4_barrier();
	*(volatile __u32 *)&k->tag = tag;
}

#endif
