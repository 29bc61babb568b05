/* healthcheck.bpf.c: tc egress program that wraps marked health-check probes (sent to a VIP) in IPIP to one real.
 *
 * The controller probes a real "through the tunnel", as client traffic reaches it: the probe is an
 * ordinary socket connecting to the VIP, with SO_MARK set to a mark the controller chose for the
 * real. On the way out of the LB host's interface this program looks the mark up in lb_hc_reals
 * and, when found, inserts an outer IP header towards the real (IPIP: 4in4 or 6in6), the source
 * being the probe's own source address, so the real's decapsulation (kernel tunl0 or our decap
 * program) hands it the VIP-addressed packet and the real answers directly (DSR), as it would a
 * client. Unmarked packets, and marks the controller did not write, pass untouched. A marked probe
 * that cannot be encapsulated (family mismatch, no room) is dropped, never sent to the VIP bare:
 * the probe then fails instead of being answered by whichever real the balancer would pick.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "abi.h"

char LICENSE[] SEC("license") = "GPL";

enum hc_constants {
	HC_ETH_LEN = 14,
	HC_IP4_LEN = 20,
	HC_IP6_LEN = 40,
	HC_TTL = 64,
	HC_IP4_DF = 0x4000,
};

/* skb->mark -> the real a probe carrying that mark is encapsulated to. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LB_DEFAULT_MAX_REALS);
	__type(key, __u32);
	__type(value, struct lb_real);
} lb_hc_reals SEC(".maps");

static __always_inline __u16 hc_csum_ip4(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;

	for (int i = 0; i < HC_IP4_LEN / 2; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

static __always_inline int encap_ip4(struct __sk_buff *skb, const struct lb_real *real)
{
	struct iphdr inner, outer = {};

	if (real->family != LB_AF_INET)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, HC_ETH_LEN, &inner, sizeof(inner)))
		return TC_ACT_SHOT;
	outer.version = 4;
	outer.ihl = HC_IP4_LEN / 4;
	outer.tos = inner.tos;
	outer.tot_len = bpf_htons(skb->len - HC_ETH_LEN + HC_IP4_LEN);
	outer.frag_off = inner.frag_off & bpf_htons(HC_IP4_DF);
	outer.ttl = HC_TTL;
	outer.protocol = IPPROTO_IPIP;
	outer.saddr = inner.saddr;
	outer.daddr = real->addr[0];
	outer.check = hc_csum_ip4(&outer);
	if (bpf_skb_adjust_room(skb, HC_IP4_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, HC_ETH_LEN, &outer, sizeof(outer), 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

static __always_inline int encap_ip6(struct __sk_buff *skb, const struct lb_real *real)
{
	struct ipv6hdr inner, outer;

	if (real->family != LB_AF_INET6)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, HC_ETH_LEN, &inner, sizeof(inner)))
		return TC_ACT_SHOT;
	outer = inner; /* version, traffic class and flow label carried over */
	outer.payload_len = bpf_htons(skb->len - HC_ETH_LEN);
	outer.nexthdr = IPPROTO_IPV6;
	outer.hop_limit = HC_TTL;
	__builtin_memcpy(&outer.daddr, real->addr, sizeof(outer.daddr));
	if (bpf_skb_adjust_room(skb, HC_IP6_LEN, BPF_ADJ_ROOM_MAC, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6))
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, HC_ETH_LEN, &outer, sizeof(outer), 0))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

SEC("tc")
int hc_encap(struct __sk_buff *skb)
{
	__u32 mark = skb->mark;
	struct lb_real *real;

	if (!mark)
		return TC_ACT_OK;
	real = bpf_map_lookup_elem(&lb_hc_reals, &mark);
	if (!real || !(real->flags & LB_REAL_PRESENT))
		return TC_ACT_OK;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return encap_ip4(skb, real);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return encap_ip6(skb, real);
	return TC_ACT_SHOT;
}
