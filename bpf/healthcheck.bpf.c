/* healthcheck.bpf.c: tc egress program that wraps marked health-check probes (sent to a VIP) to one real, as its VIP does.
 *
 * The controller probes a real "through the tunnel", as client traffic reaches it: the probe is an
 * ordinary socket connecting to the VIP, with SO_MARK set to a mark the controller chose for the
 * (real, encapsulation) pair. On the way out of the LB host's interface this program looks the mark
 * up in lb_hc_reals and, when found, inserts the outer headers the VIP's encapsulation uses: IPIP
 * (4in4 or 6in6) or GUE variant 1 / 0 (UDP to the configured port, source port 49152 + 14 bits of
 * the packet's hash; UDP checksum 0 over IPv4, computed over IPv6). The outer source is the probe's
 * own source address, so the real's decapsulation (kernel tunl0 / fou, or our decap program) hands
 * it the VIP-addressed packet and the real answers directly (DSR), as it would a client. Unmarked
 * packets, and marks the controller did not write, are not ours: they go on untouched to whatever
 * runs after this program (TC_ACT_UNSPEC, tcx's "next"), as from Katran's. A marked probe that cannot be
 * encapsulated (family mismatch, no room, an IPv6 GUE probe too long to checksum here) is dropped,
 * never sent to the VIP bare: the probe then fails instead of being answered by whichever real the
 * balancer would pick.
 */
#include <linux/pkt_cls.h>

#include "parse.h"
#include "csum.h"
#include "gue.h"

char LICENSE[] SEC("license") = "GPL";

enum hc_constants {
	HC_IP4_LEN = 20,
	HC_IP6_LEN = 40,
	HC_UDP_LEN = 8,
	HC_CHUNK = 64,
	HC_MAX_CHUNKS = 24, /* IPv6 GUE probes up to 1536 bytes are checksummed */
};

/* skb->mark -> where a probe carrying that mark goes and how it is wrapped. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_MAX_REALS);
	__type(key, __u32);
	__type(value, struct lb_hc_target);
} lb_hc_reals SEC(".maps");

/* The outer headers, written in one store after the room is made. */
struct hc_outer {
	union {
		struct iphdr ip4;
		struct ipv6hdr ip6;
	};
	struct udphdr udp;
	__u8 gue[LB_GUE_HDR_LEN];
};

/* Ones' complement sum (unfolded) of len bytes of the packet from off; -1 when too long or unreadable. */
static __always_inline __s64 hc_sum_packet(struct __sk_buff *skb, __u32 off, __u32 len)
{
	__u8 buf[HC_CHUNK];
	__u64 sum = 0;

	for (int i = 0; i < HC_MAX_CHUNKS; i++) {
		__u32 n = len - i * HC_CHUNK;

		if ((__s32)n <= 0)
			return sum;
		__builtin_memset(buf, 0, sizeof(buf));
		if (n >= HC_CHUNK) {
			if (bpf_skb_load_bytes(skb, off + i * HC_CHUNK, buf, HC_CHUNK))
				return -1;
		} else {
			volatile __u32 spilled = n; /* reloaded: the bounds below are checked on what is passed */
			__u32 tail = spilled;

			if (tail == 0 || tail >= HC_CHUNK || bpf_skb_load_bytes(skb, off + i * HC_CHUNK, buf, tail))
				return -1;
		}
		sum += csum_words(buf, HC_CHUNK / 2); /* a short last chunk is zero-padded: same sum */
	}
	return len > HC_MAX_CHUNKS * HC_CHUNK ? -1 : (__s64)sum;
}

static __always_inline int gue_mode(__u8 encap)
{
	return encap == LB_ENCAP_GUE1 || encap == LB_ENCAP_GUE0;
}

/* The UDP (and GUE) header of a GUE probe; check 0 (the caller fills it in for IPv6). */
static __always_inline __u32 hc_fill_udp(struct __sk_buff *skb, struct hc_outer *o, const struct lb_hc_target *t,
					 __u32 inner_len, __u8 inner_proto)
{
	__u32 udp_len = HC_UDP_LEN + (t->encap == LB_ENCAP_GUE0 ? LB_GUE_HDR_LEN : 0) + inner_len;

	o->udp.source = gue_sport(bpf_get_hash_recalc(skb));
	o->udp.dest = t->gue_port;
	o->udp.len = bpf_htons(udp_len);
	o->udp.check = 0;
	if (t->encap == LB_ENCAP_GUE0)
		gue_write_v0(o->gue, inner_proto);
	return udp_len;
}

static __always_inline int encap_ip4(struct __sk_buff *skb, const struct lb_hc_target *t)
{
	struct iphdr inner;
	struct hc_outer o = {};
	__u32 inner_len = skb->len - PARSE_ETH_LEN, extra = 0, len;
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4;

	if (bpf_skb_load_bytes(skb, PARSE_ETH_LEN, &inner, sizeof(inner)))
		return TC_ACT_SHOT;
	if (gue_mode(t->encap)) {
		extra = hc_fill_udp(skb, &o, t, inner_len, IPPROTO_IPIP) - inner_len;
		flags |= BPF_F_ADJ_ROOM_ENCAP_L4_UDP;
	}
	o.ip4.version = 4;
	o.ip4.ihl = HC_IP4_LEN / 4;
	o.ip4.tos = inner.tos;
	o.ip4.tot_len = bpf_htons(HC_IP4_LEN + extra + inner_len);
	o.ip4.frag_off = inner.frag_off & bpf_htons(IP4_DF);
	o.ip4.ttl = LB_OUTER_TTL;
	o.ip4.protocol = extra ? IPPROTO_UDP : IPPROTO_IPIP;
	o.ip4.saddr = inner.saddr;
	o.ip4.daddr = t->real.addr[0];
	o.ip4.check = csum_ipv4_header(&o.ip4);
	len = HC_IP4_LEN + extra;
	if (bpf_skb_adjust_room(skb, len, BPF_ADJ_ROOM_MAC, flags))
		return TC_ACT_SHOT;
	/* the IP header, then what follows it (UDP and GUE) sits right after in struct hc_outer only for IPv6 */
	if (bpf_skb_store_bytes(skb, PARSE_ETH_LEN, &o.ip4, HC_IP4_LEN, 0))
		return TC_ACT_SHOT;
	if (extra && bpf_skb_store_bytes(skb, PARSE_ETH_LEN + HC_IP4_LEN, &o.udp, extra == HC_UDP_LEN ? HC_UDP_LEN :
					  HC_UDP_LEN + LB_GUE_HDR_LEN, 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

static __always_inline int encap_ip6(struct __sk_buff *skb, const struct lb_hc_target *t)
{
	struct hc_outer o = {};
	__u32 inner_len = skb->len - PARSE_ETH_LEN, extra = 0, udp_len;
	__u64 flags = BPF_F_ADJ_ROOM_ENCAP_L3_IPV6;

	/* the inner header as the outer's start: version, traffic class and flow label carried over */
	if (bpf_skb_load_bytes(skb, PARSE_ETH_LEN, &o.ip6, sizeof(o.ip6)))
		return TC_ACT_SHOT;
	o.ip6.hop_limit = LB_OUTER_TTL;
	__builtin_memcpy(&o.ip6.daddr, t->real.addr, sizeof(o.ip6.daddr));
	if (gue_mode(t->encap)) {
		__s64 inner_sum = hc_sum_packet(skb, PARSE_ETH_LEN, inner_len);
		__u64 sum;

		if (inner_sum < 0)
			return TC_ACT_SHOT;
		udp_len = hc_fill_udp(skb, &o, t, inner_len, IPPROTO_IPV6);
		extra = udp_len - inner_len;
		flags |= BPF_F_ADJ_ROOM_ENCAP_L4_UDP;
		o.ip6.nexthdr = IPPROTO_UDP;
		/* pseudo-header (addresses, length, next header), UDP and GUE headers, the inner packet */
		sum = (__u64)inner_sum + csum_words(&o.ip6.saddr, 16) + bpf_htons(udp_len) + bpf_htons(IPPROTO_UDP);
		sum += csum_words(&o.udp, (extra) / 2);
		o.udp.check = csum_fold(sum);
		if (!o.udp.check)
			o.udp.check = 0xffff;
	} else {
		o.ip6.nexthdr = IPPROTO_IPV6;
	}
	o.ip6.payload_len = bpf_htons(extra + inner_len);
	if (bpf_skb_adjust_room(skb, HC_IP6_LEN + extra, BPF_ADJ_ROOM_MAC, flags))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, PARSE_ETH_LEN, &o, extra == HC_UDP_LEN + LB_GUE_HDR_LEN ? sizeof(o) :
				extra == HC_UDP_LEN ? HC_IP6_LEN + HC_UDP_LEN : HC_IP6_LEN, 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

SEC("tc")
int hc_encap(struct __sk_buff *skb)
{
	__u32 mark = skb->mark;
	struct lb_hc_target *t;

	if (!mark)
		return TC_ACT_UNSPEC;
	t = bpf_map_lookup_elem(&lb_hc_reals, &mark);
	if (!t || !(t->real.flags & LB_REAL_PRESENT))
		return TC_ACT_UNSPEC;
	/* a probe whose family is not its real's is dropped, as is anything not IP */
	if (skb->protocol == bpf_htons(ETH_P_IP) && t->real.family == LB_AF_INET)
		return encap_ip4(skb, t);
	if (skb->protocol == bpf_htons(ETH_P_IPV6) && t->real.family == LB_AF_INET6)
		return encap_ip6(skb, t);
	return TC_ACT_SHOT;
}
