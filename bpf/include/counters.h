/* counters.h: per-CPU counting of outcomes (reasons), events, and per-VIP / per-real traffic. */
#ifndef L4LAB_COUNTERS_H
#define L4LAB_COUNTERS_H

#include "maps.h"

/* The events one packet met, gathered while it is processed and counted with its reason at the end
 * (one lookup of lb_counts per packet instead of one per counter). */
struct lb_tally {
	__u16 events;  /* up to two enum lb_event + 1, one per byte (0: none); a packet meets at most two */
	__u16 pad;
};

/* Shifts, not an index: clang turns a choice between two array slots into pointer arithmetic
 * that the verifier refuses. */
static __always_inline void tally_event(struct lb_tally *t, enum lb_event event)
{
	t->events = (t->events << 8) | (event + 1);
}

/* Brings a per-CPU traffic counter (its lookup's pointer and its value's line) into the cache before
 * the work it will count, so that count_into afterwards finds both there: fetched early they come
 * while the ring and the session table do, where after the session insert they wait behind its
 * locks (architecture.md, decisions: "counters touched before the session insert"). The pointer is
 * looked up again for the count: kept, it costs the verifier far more instructions. */
static __always_inline void counter_touch(void *map, __u32 index)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &index);

	if (c)
		asm volatile("" ::"r"(*(volatile __u64 *)&c->packets));
}

static __always_inline void count_into(void *map, __u32 index, __u32 bytes)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &index);

	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

/* events[e - 1]++ for a tally byte e (0: nothing). The empty asm keeps clang from folding the bound
 * check into an earlier test on another register, which the verifier could not follow. */
static __always_inline void count_tallied(struct lb_counts *c, __u32 e)
{
	e -= 1;
	asm volatile("" : "+r"(e));
	if (e < LB_EVENT_COUNT)
		c->events[e]++;
}

/* Counts one event at once, for an event of a rare path (route.h), or of a packet whose program is
 * about to be replaced (a tail call): the tally of the common path holds two. */
static __always_inline void count_event_now(enum lb_event event)
{
	struct lb_counts *c = bpf_map_lookup_elem(&lb_counts, &lb_zero_key);

	if (c)
		count_tallied(c, event + 1);
}

/* Counts the packet's outcome and its events in this CPU's record. */
static __always_inline void count_packet(enum lb_reason reason, __u32 bytes, const struct lb_tally *t)
{
	__u32 zero = 0, r = reason;
	struct lb_counts *c = bpf_map_lookup_elem(&lb_counts, &zero);

	if (!c)
		return;
	if (r < LB_REASON_COUNT) {
		c->reasons[r].packets++;
		c->reasons[r].bytes += bytes;
	}
	if (t->events) {
		count_tallied(c, t->events & 0xff);
		count_tallied(c, t->events >> 8);
	}
}

#endif
