/* counters.h: per-CPU counting of outcomes (reasons), events, and per-VIP / per-real traffic. */
#ifndef L4LAB_COUNTERS_H
#define L4LAB_COUNTERS_H

#include "maps.h"

/* The events one packet met, gathered while it is processed and counted with its reason at the end
 * (one lookup of lb_counts per packet instead of one per counter). */
struct lb_tally {
	__u8 ev[2]; /* enum lb_event, LB_EVENT_COUNT when unused: a packet meets at most two events */
};

static __always_inline void tally_event(struct lb_tally *t, enum lb_event event)
{
	if (t->ev[0] == LB_EVENT_COUNT)
		t->ev[0] = event;
	else
		t->ev[1] = event;
}

static __always_inline void count_into(void *map, __u32 index, __u32 bytes)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &index);

	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
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
	if (t->ev[0] < LB_EVENT_COUNT)
		c->events[t->ev[0]]++;
	if (t->ev[1] < LB_EVENT_COUNT)
		c->events[t->ev[1]]++;
}

#endif
