/* route.h: routing beyond the flow hash, for the VIPs that ask for it: server ids, pinned source prefixes, UDP flow migration.
 *
 * - Server ids (Katran's): a real's host id carried by the packet picks the real, so a flow keeps its
 *   real across ring changes and across LB nodes whatever its 5-tuple does. QUIC: the destination
 *   connection id of short headers and of long-header Handshake / Retry packets (Initial and 0-RTT
 *   carry the client's random one), read as Katran's layouts: the top two bits name the layout, v1
 *   holds 16 bits of id from bit 2, v2 24 bits from byte 1, v3 32 bits from byte 1. QUIC v2 (RFC 9369)
 *   rotates the long-header type bits; they are rotated back before the test. TCP: option kind 183,
 *   length 6, the id in the 4 bytes little-endian (what Katran's x86 fleets put on the wire), on any
 *   segment but a SYN. UDP: Katran's stable-routing header, payload byte 0x52 then the id in bytes
 *   1..3 (its v2 layout). An id of 0, or none, falls back to the session and the ring; an id no real
 *   has falls back too, counted apart. A routed packet writes its real into the flow's session, so
 *   later packets without an id (QUIC short headers that lost theirs, TCP segments without the
 *   option) stay with it.
 * - Source prefixes: a new flow (no session) whose client address falls in a prefix pinned for its
 *   VIP goes to the pinned real, the longest prefix winning (Katran's LPM_SRC).
 * - UDP flow migration: a UDP session pointing at a real that health checks took down for this VIP
 *   is chosen again from the ring (Katran's F_UDP_FLOW_MIGRATION); TCP sessions are never moved.
 * All of it lives in route_extra(), a global function that forward() calls only for VIPs with one of
 * these flags: the verifier walks it once, and other VIPs' packets pay one test of the flags. Its
 * events are counted as they happen (count_event_now): the tally of the common path keeps two.
 */
#ifndef L4LAB_ROUTE_H
#define L4LAB_ROUTE_H

#include "parse.h"
#include "maps.h"
#include "counters.h"
#include "session.h"

enum route_constants {
	QUIC_LONG_HEADER = 0x80,
	QUIC_TYPE_MASK = 0x30,
	QUIC_V1_HANDSHAKE = 0x20,    /* v1 long-header types below it (Initial, 0-RTT) carry the client's id */
	QUIC_V2_VERSION = 0x6b3343cf,
	QUIC_CID_READ = 8,           /* bytes of connection id read (Katran's minimum length) */
	QUIC_LONG_DCID_OFF = 6,      /* flags (1), version (4), DCID length (1) */
	QUIC_SHORT_DCID_OFF = 1,
	STABLE_RT_TYPE = 0x52,
	STABLE_RT_LEN = 8,
	TPR_KIND = 183,
	TPR_LEN = 6,
	TCP_OPT_EOL = 0,
	TCP_OPT_NOP = 1,
	TCP_OPT_MAX = 40,            /* option bytes a TCP header can hold: the walk's bound */
	ROUTE_LPM_FULL = 32 + 128,   /* lb_src_routes lookups: the VIP number and every address bit */
};

/* What forward() has decided when it hands a packet of such a VIP to route_extra(), and what it gets back. */
struct route_choice {
	__u32 vip_num;
	__u32 vip_flags;
	__u32 real_id;    /* in: the session's real (0: none); out: the real, 0 to let the ring choose */
	__u8 insert;      /* in and out: real_id must be written into the flow's session */
	__u8 may_insert;  /* the packet may write its session (not an RST, sessions on) */
	__u8 pad[2];
};

/* `len` bytes of the L4 payload from `at` (bytes past the L4 header's start), inside the IP packet. */
static __always_inline __u8 *l4_bytes(struct xdp_md *ctx, const struct packet *pkt, __u32 at, __u32 len)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 off = pkt->l4_off + at;
	__u8 *p;

	if (off > PARSE_MAX_L4_OFF + 64 || off + len > (__u32)pkt->l2_len + pkt->ip_len)
		return NULL;
	p = data + off;
	if ((void *)(p + len) > data_end)
		return NULL;
	return p;
}

/* The server id a connection id holds in Katran's layouts; 0 for none. */
static __always_inline __u32 cid_server_id(const __u8 *c)
{
	switch (c[0] >> 6) {
	case 1:
		return ((c[0] & 0x3f) << 10) | (c[1] << 2) | (c[2] >> 6);
	case 2:
		return (c[1] << 16) | (c[2] << 8) | c[3];
	case 3:
		return ((__u32)c[1] << 24) | (c[2] << 16) | (c[3] << 8) | c[4];
	default:
		return 0;
	}
}

static __always_inline __u32 quic_server_id(struct xdp_md *ctx, const struct packet *pkt)
{
	__u8 *q = l4_bytes(ctx, pkt, sizeof(struct udphdr), 1);
	__u8 type;

	if (!q)
		return 0;
	if (!(q[0] & QUIC_LONG_HEADER)) {
		q = l4_bytes(ctx, pkt, sizeof(struct udphdr), QUIC_SHORT_DCID_OFF + QUIC_CID_READ);
		return q ? cid_server_id(q + QUIC_SHORT_DCID_OFF) : 0;
	}
	q = l4_bytes(ctx, pkt, sizeof(struct udphdr), QUIC_LONG_DCID_OFF + QUIC_CID_READ);
	if (!q || q[QUIC_LONG_DCID_OFF - 1] < QUIC_CID_READ)
		return 0;
	type = q[0] & QUIC_TYPE_MASK;
	if (*(__be32 *)(q + 1) == bpf_htonl(QUIC_V2_VERSION))
		type = (type + QUIC_TYPE_MASK) & QUIC_TYPE_MASK; /* v2's Initial is v1's 0-RTT, and so on round */
	if (type < QUIC_V1_HANDSHAKE)
		return 0;
	return cid_server_id(q + QUIC_LONG_DCID_OFF);
}

static __always_inline __u32 stable_server_id(struct xdp_md *ctx, const struct packet *pkt)
{
	__u8 *h = l4_bytes(ctx, pkt, sizeof(struct udphdr), STABLE_RT_LEN);

	if (!h || h[0] != STABLE_RT_TYPE)
		return 0;
	return (h[1] << 16) | (h[2] << 8) | h[3];
}

/* The server id of a TCP option kind 183 (not on a SYN); 0 for none. The options are copied out (to
 * the per-CPU scratch page: the stack of forward_steered()'s call chain has no room) and walked byte by
 * byte to their end, EOL or the first malformed one: a walk whose offset jumps by each option's length
 * gives the verifier a state per offset and never finishes. */
static __always_inline __u32 tcp_server_id(struct xdp_md *ctx, const struct packet *pkt)
{
	__u8 *th = l4_bytes(ctx, pkt, 0, sizeof(struct tcphdr));
	struct scratch_page *page = bpf_map_lookup_elem(&lb_scratch, &lb_zero_key);
	__u8 *opts;
	__u32 len, skip = 0;

	if (!th || !page || (th[13] & TCPF_BYTE_SYN))
		return 0;
	opts = page->bytes;
	len = (th[12] >> 4) * 4;
	if (len < sizeof(struct tcphdr) + TPR_LEN || !l4_bytes(ctx, pkt, 0, len))
		return 0;
	len -= sizeof(struct tcphdr);
	/* 1..64, restated opaquely to clang, so that the verifier sees the bound on what is passed */
	asm volatile("%[n] += -1; %[n] &= 0x3f; %[n] += 1" : [n] "+r"(len));
	if (bpf_xdp_load_bytes(ctx, pkt->l4_off + sizeof(struct tcphdr), opts, len))
		return 0;
	for (int i = 0; i < TCP_OPT_MAX; i++) {
		if (i >= len)
			break;
		if (skip) { /* inside the option before: its bytes are its own, zeros included */
			skip--;
			continue;
		}
		if (opts[i] == TCP_OPT_EOL)
			break;
		if (opts[i] == TCP_OPT_NOP)
			continue;
		if (i + 1 >= TCP_OPT_MAX || opts[i + 1] < 2 || i + opts[i + 1] > len)
			break;
		if (opts[i] == TPR_KIND) {
			if (opts[i + 1] != TPR_LEN || i + TPR_LEN > TCP_OPT_MAX)
				break;
			return opts[i + 2] | (opts[i + 3] << 8) | (opts[i + 4] << 16) | ((__u32)opts[i + 5] << 24);
		}
		skip = opts[i + 1] - 1;
	}
	return 0;
}

static __always_inline __u32 packet_server_id(struct xdp_md *ctx, const struct packet *pkt, __u32 flags)
{
	if ((flags & LB_VIP_SID_TCP) && pkt->flow.proto == IPPROTO_TCP)
		return tcp_server_id(ctx, pkt);
	if (pkt->flow.proto != IPPROTO_UDP)
		return 0;
	if (flags & LB_VIP_SID_QUIC)
		return quic_server_id(ctx, pkt);
	return (flags & LB_VIP_SID_STABLE) ? stable_server_id(ctx, pkt) : 0;
}

/* A real id that names a real in lb_reals, else 0. */
static __always_inline __u32 present_real(const __u32 *real_id)
{
	struct lb_real *real;

	if (!real_id || !*real_id)
		return 0;
	real = bpf_map_lookup_elem(&lb_reals, real_id);
	return real && real->family ? *real_id : 0;
}

static __always_inline void route_to(struct route_choice *rc, __u32 real_id)
{
	if (real_id != rc->real_id)
		rc->insert = rc->may_insert;
	rc->real_id = real_id;
}

/* Server ids, pinned source prefixes and UDP flow migration for one packet of `flow` (client -> VIP),
 * on a VIP with one of the LB_VIP_ROUTE_EXTRA flags; updates *rc (see struct route_choice). A global
 * function: verified once, apart from forward()'s two inlined copies. */
__noinline int route_extra(struct xdp_md *ctx, const struct packet *pkt, const struct lb_flow *flow,
			   struct route_choice *rc)
{
	__u32 flags, sid, real_id;

	if (!ctx || !pkt || !flow || !rc)
		return 0; /* never: the caller passes its stack */
	flags = rc->vip_flags;
	if ((flags & LB_VIP_UDP_MIGRATE) && rc->real_id && flow->proto == IPPROTO_UDP) {
		struct lb_down_key down = { .vip_num = rc->vip_num, .real_id = rc->real_id };

		if (bpf_map_lookup_elem(&lb_down_reals, &down)) {
			route_to(rc, 0);
			rc->insert = rc->may_insert;
			count_event_now(LB_EV_UDP_MIGRATED);
		}
	}
	if (flags & (LB_VIP_SID_QUIC | LB_VIP_SID_TCP | LB_VIP_SID_STABLE)) {
		sid = packet_server_id(ctx, pkt, flags);
		if (!sid) {
			count_event_now(LB_EV_SID_NONE);
		} else {
			real_id = present_real(bpf_map_lookup_elem(&lb_server_ids, &sid));
			if (real_id) {
				count_event_now(LB_EV_SID_ROUTED);
				route_to(rc, real_id);
				return 0;
			}
			count_event_now(LB_EV_SID_UNKNOWN);
		}
	}
	if (!rc->real_id && (flags & LB_VIP_SRC_ROUTES)) {
		struct lb_src_key key = { .prefixlen = ROUTE_LPM_FULL, .vip_num = rc->vip_num };

		__builtin_memcpy(key.addr, flow->src, sizeof(key.addr));
		real_id = present_real(bpf_map_lookup_elem(&lb_src_routes, &key));
		if (real_id) {
			count_event_now(LB_EV_SRC_PINNED);
			route_to(rc, real_id);
		}
	}
	return 0;
}

#endif
