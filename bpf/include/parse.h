/* parse.h: reads Ethernet (one 802.1Q tag), IPv4, IPv6 with extension headers and L4 ports into struct packet. */
#ifndef L4LAB_PARSE_H
#define L4LAB_PARSE_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "abi.h"

/* Branch hints: clang lays the unlikely side out after the function's hot path, so a session hit's
 * instructions sit together in fewer cache lines (architecture.md, decisions: "cold paths laid out
 * apart"). */
#ifndef likely
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#endif

/* Bounds that keep the verifier's view of offsets finite. */
enum parse_limits {
	PARSE_MAX_EXT_HDRS = 8,   /* IPv6 extension headers walked before giving up */
	PARSE_MAX_L4_OFF = 1024,  /* no legitimate header chain is longer */
	PARSE_ETH_LEN = 14,
	PARSE_VLAN_LEN = 4,
	PARSE_L2_MAX = 18,        /* Ethernet plus one 802.1Q tag */
};

/* "No outcome yet": a parse step returns either this or the enum lb_reason that ends the packet. */
enum parse_status {
	PARSE_OK = LB_REASON_COUNT,
};

enum parse_ip_flags {
	IP4_DF = 0x4000,
	IP4_MF = 0x2000,
	IP4_OFFSET = 0x1fff,
};

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "parse_ipv4 and process() store a 32-bit field with the zero or bytes after it as one 64-bit word");

/* What the balancer knows about one frame once it is parsed. Addresses and ports in network order. */
struct __attribute__((aligned(8))) packet { /* 8: see parse_ipv4 and process() */
	struct lb_flow flow; /* the packet's own 5-tuple, as received */
	__u32 frame_len;     /* bytes in the whole frame (all fragments of an xdp.frags buffer) */
	__u16 l2_len;        /* 14, or 18 with an 802.1Q tag */
	__u16 l4_off;        /* offset of the L4 header from the start of the frame */
	__u16 ip_len;        /* the IP packet's length according to its header */
	__u8 tos;            /* IPv4 TOS / IPv6 traffic class (DSCP and ECN) */
	__u8 tcp_flags;      /* byte 13 of the TCP header */
	__u8 df;             /* IPv4 DF bit set */
	__u8 fragment;       /* IPv4 MF/offset, or an IPv6 fragment header */
	__u8 options;        /* IPv4 header longer than 20 bytes */
	__u8 udp_csum_zero;  /* a UDP datagram sent without a checksum (0) */
};

static __always_inline int is_vlan(__be16 proto)
{
	return proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD);
}

/* Ethernet and at most one VLAN tag; sets l2_len and the IP family. */
static __always_inline int parse_eth(void *data, void *data_end, struct packet *pkt)
{
	struct ethhdr *eth = data;
	__be16 proto;

	if ((void *)(eth + 1) > data_end)
		return LB_DROP_MALFORMED_ETH;
	proto = *(const __be16 *)(data + 12); /* one 16-bit load: struct ethhdr is packed (byte loads) */
	pkt->l2_len = PARSE_ETH_LEN;
	if (is_vlan(proto)) {
		struct vlan_hdr *vlan = (void *)(eth + 1);

		if ((void *)(vlan + 1) > data_end)
			return LB_DROP_MALFORMED_ETH;
		proto = vlan->proto;
		if (is_vlan(proto))
			return LB_DROP_VLAN_STACKED;
		pkt->l2_len = PARSE_ETH_LEN + PARSE_VLAN_LEN;
	}
	if (proto == bpf_htons(ETH_P_IP))
		pkt->flow.family = LB_AF_INET;
	else if (proto == bpf_htons(ETH_P_IPV6))
		pkt->flow.family = LB_AF_INET6;
	else
		return LB_PASS_NOT_IP;
	return PARSE_OK;
}

static __always_inline int parse_ipv4(void *data, void *data_end, struct packet *pkt)
{
	struct iphdr *ip = data + (pkt->l2_len & 0x1f);
	__u32 hdr_len, tot_len, frag;

	if ((void *)(ip + 1) > data_end)
		return LB_DROP_MALFORMED_IP;
	hdr_len = ip->ihl * 4;
	tot_len = bpf_ntohs(ip->tot_len);
	if (ip->version != 4 || hdr_len < sizeof(*ip) || tot_len < hdr_len ||
	    tot_len > pkt->frame_len - pkt->l2_len)
		return LB_DROP_MALFORMED_IP;
	frag = bpf_ntohs(ip->frag_off);
	pkt->ip_len = tot_len;
	pkt->l4_off = pkt->l2_len + hdr_len;
	pkt->tos = ip->tos;
	pkt->df = !!(frag & IP4_DF);
	pkt->fragment = !!(frag & (IP4_MF | IP4_OFFSET));
	pkt->options = hdr_len > sizeof(*ip);
	pkt->flow.proto = ip->protocol;
	/* Each address with the zero word after it, in one 64-bit store (little-endian: the address
	 * first): the flow's later 64-bit loads (the VIP key, the flow key's copy) are then forwarded
	 * from one store. Over a 32-bit store into the zeroed struct they would wait for both stores to
	 * reach the cache (architecture.md, decisions: "header words, not bytes"). */
	*(__u64 *)&pkt->flow.src[0] = ip->saddr;
	*(__u64 *)&pkt->flow.dst[0] = ip->daddr;
	return PARSE_OK;
}

static __always_inline int is_ext_hdr(__u8 nh)
{
	return nh == IPPROTO_HOPOPTS || nh == IPPROTO_ROUTING || nh == IPPROTO_DSTOPTS ||
	       nh == IPPROTO_FRAGMENT || nh == IPPROTO_AH;
}

/* IPv6 header and its extension-header chain; a fragment header marks the packet as a fragment. */
static __always_inline int parse_ipv6(void *data, void *data_end, struct packet *pkt)
{
	struct ipv6hdr *ip6 = data + (pkt->l2_len & 0x1f);
	__u32 plen, off, end_off;
	__u8 nh;

	if ((void *)(ip6 + 1) > data_end)
		return LB_DROP_MALFORMED_IP;
	plen = bpf_ntohs(ip6->payload_len);
	if (ip6->version != 6 || plen == 0 || sizeof(*ip6) + plen > pkt->frame_len - pkt->l2_len)
		return LB_DROP_MALFORMED_IP;
	pkt->ip_len = sizeof(*ip6) + plen;
	pkt->tos = (ip6->priority << 4) | (ip6->flow_lbl[0] >> 4);
	__builtin_memcpy(pkt->flow.src, &ip6->saddr, 16);
	__builtin_memcpy(pkt->flow.dst, &ip6->daddr, 16);
	off = pkt->l2_len + sizeof(*ip6);
	end_off = pkt->l2_len + pkt->ip_len;
	nh = ip6->nexthdr;

	for (int i = 0; i < PARSE_MAX_EXT_HDRS; i++) {
		struct ipv6_opt_hdr *ext;

		if (!is_ext_hdr(nh))
			break;
		if (off > PARSE_MAX_L4_OFF)
			return LB_DROP_MALFORMED_IP;
		ext = data + off;
		if ((void *)(ext + 1) > data_end)
			return LB_DROP_MALFORMED_IP;
		if (nh == IPPROTO_FRAGMENT) {
			pkt->fragment = 1;
			off += 8;
		} else if (nh == IPPROTO_AH) {
			off += (ext->hdrlen + 2) * 4;
		} else {
			off += (ext->hdrlen + 1) * 8;
		}
		nh = ext->nexthdr;
	}
	if (off > end_off)
		return LB_DROP_MALFORMED_IP;
	pkt->l4_off = off;
	pkt->flow.proto = nh;
	return PARSE_OK;
}

/* A pointer to `len` bytes of L4 header inside the IP packet, or NULL when they are not all there. */
static __always_inline void *l4_header(void *data, void *data_end, const struct packet *pkt, __u32 len)
{
	__u32 off = pkt->l4_off;
	void *p;

	if (off > PARSE_MAX_L4_OFF || off + len > (__u32)pkt->l2_len + pkt->ip_len)
		return NULL;
	p = data + off;
	if (p + len > data_end)
		return NULL;
	return p;
}

#endif
