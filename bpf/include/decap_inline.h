/* decap_inline.h: inline decap on the LB: IPIP and GUE addressed to one of its own addresses stripped, the inner packet then balanced, handed to the host or sent back out.
 *
 * An address of the LB listed in lb_decaps (with settings.decaps counting them) names what its
 * tunnel packets are for: chained LBs and tunnelled health checks send their traffic to it to be
 * balanced (LB_DECAP_ACTION_BALANCE: the program runs again on the inner packet, by a tail call);
 * services on the LB host itself take theirs from the stack (LOCAL); reals that send their replies
 * back through the LB have them sent on to the next hop (EGRESS, Katran's egress decap). The LB is
 * a router hop for the inner packet in every case: its TTL / hop limit is lowered by one, and one
 * that runs out is dropped untouched. Tunnel packets to any other address pass untouched, as do GUE
 * control messages; tunnel.h reads the headers, as it does for the reals' decap program.
 */
#ifndef L4LAB_DECAP_INLINE_H
#define L4LAB_DECAP_INLINE_H

#include "parse.h"
#include "maps.h"
#include "csum.h"
#include "icmp.h"
#include "tunnel.h"

/* decap_inline()'s answer when the inner packet is to be balanced afresh (not a reason: the caller
 * tail-calls the balancer). */
enum decap_inline_status {
	DECAP_RECIRCULATE = LB_REASON_COUNT + 1,
};

/* Lowers the TTL / hop limit of the inner IP packet at `ip` by one (the IPv4 checksum updated as RFC
 * 1624 says); -1, touching nothing, when it would run out. */
static __always_inline int inner_ttl_step(__u8 *ip, void *data_end, __u8 family)
{
	if (family == LB_AF_INET) {
		__u16 old, new;

		if ((void *)(ip + sizeof(struct iphdr)) > data_end || ip[8] <= 1)
			return -1;
		old = *(__u16 *)(ip + 8);
		ip[8]--;
		new = *(__u16 *)(ip + 8);
		*(__u16 *)(ip + 10) = csum_replace16(*(__u16 *)(ip + 10), old, new);
		return 0;
	}
	if ((void *)(ip + sizeof(struct ipv6hdr)) > data_end || ip[7] <= 1)
		return -1;
	ip[7]--;
	return 0;
}

/* Strips the outer headers t describes, keeping the L2 header (and its tag) with the inner ethertype. */
static __always_inline int decap_strip(struct xdp_md *ctx, const struct tunnel *t)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 l2[PARSE_L2_MAX];
	__be16 ethertype = t->inner_family == LB_AF_INET ? bpf_htons(ETH_P_IP) : bpf_htons(ETH_P_IPV6);

	if (data + PARSE_L2_MAX > data_end)
		return -1;
	__builtin_memcpy(l2, data, PARSE_L2_MAX);
	if (bpf_xdp_adjust_head(ctx, t->outer_len))
		return -1;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + PARSE_L2_MAX > data_end)
		return -1;
	if (t->l2_len == PARSE_ETH_LEN) {
		__builtin_memcpy(data, l2, PARSE_ETH_LEN - 2);
		*(__be16 *)(data + PARSE_ETH_LEN - 2) = ethertype;
	} else {
		__builtin_memcpy(data, l2, PARSE_L2_MAX - 2);
		*(__be16 *)(data + PARSE_L2_MAX - 2) = ethertype;
	}
	return 0;
}

/* For a packet that is no VIP's: the reason that ends it (LB_PASS_NOT_VIP unless it is a tunnel to
 * one of our decap addresses), or DECAP_RECIRCULATE once its inner packet is to be balanced. A
 * global function: verified once, and off the path of VIP traffic. */
__noinline int decap_inline(struct xdp_md *ctx, const struct packet *pkt)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct lb_settings *s = bpf_map_lookup_elem(&lb_settings, &lb_zero_key);
	struct lb_addr_key key = {};
	struct tunnel t = {};
	__u32 *action;
	int r;

	if (!pkt || !s || !s->decaps)
		return LB_PASS_NOT_VIP;
	if (pkt->flow.proto == IPPROTO_UDP && pkt->flow.dport != s->gue_port)
		return LB_PASS_NOT_VIP;
	__builtin_memcpy(key.addr, pkt->flow.dst, sizeof(key.addr));
	key.family = pkt->flow.family;
	action = bpf_map_lookup_elem(&lb_decaps, &key);
	if (!action || *action == LB_DECAP_ACTION_NONE)
		return LB_PASS_NOT_VIP;
	if (tunnel_outer(data, data_end, pkt->frame_len, bpf_ntohs(s->gue_port), &t) != PARSE_OK)
		return LB_PASS_NOT_VIP;
	r = tunnel_inner(data, data_end, &t);
	if (r == LB_DECAP_PASS_GUE_CONTROL)
		return LB_PASS_NOT_VIP;
	if (r != PARSE_OK)
		return LB_DROP_DECAP_MALFORMED;
	if (inner_ttl_step(data + ((t.l2_len + t.outer_len) & 0x1ff), data_end, t.inner_family))
		return LB_DROP_TTL_EXPIRED;
	if (decap_strip(ctx, &t))
		return LB_DROP_DECAP_FAILED;
	if (*action == LB_DECAP_ACTION_BALANCE)
		return DECAP_RECIRCULATE;
	if (*action == LB_DECAP_ACTION_LOCAL)
		return LB_PASS_DECAP_LOCAL;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + PARSE_ETH_LEN > data_end)
		return LB_DROP_DECAP_FAILED;
	swap_macs(data);
	return LB_TX_DECAP_EGRESS;
}

#endif
