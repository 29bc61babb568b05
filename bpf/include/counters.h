/* counters.h: per-CPU counting of outcomes (reasons), events, and per-VIP / per-real traffic. */
#ifndef L4LAB_COUNTERS_H
#define L4LAB_COUNTERS_H

#include "maps.h"

static __always_inline void count_into(void *map, __u32 index, __u32 bytes)
{
	struct lb_counter *c = bpf_map_lookup_elem(map, &index);

	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

static __always_inline void count_reason(enum lb_reason reason, __u32 bytes)
{
	count_into(&lb_reasons, reason, bytes);
}

static __always_inline void count_event(enum lb_event event)
{
	__u32 index = event;
	__u64 *n = bpf_map_lookup_elem(&lb_events, &index);

	if (n)
		(*n)++;
}

#endif
