/* tunnel.h: recognises an IPIP or GUE packet and locates its inner IP packet (whether it is addressed to us is the caller's question). */
#ifndef L4LAB_TUNNEL_H
#define L4LAB_TUNNEL_H

#include "parse.h"
#include "gue.h"

enum tunnel_constants {
	TUNNEL_MAX_HDRS = 512,        /* L2 + outer IP (+ extension headers) + UDP + GUE + inner IP */
	TUNNEL_MAX_OUTER_OFF = 384,   /* no outer header chain we decapsulate ends later than this */
};

/* Where the inner packet of a tunnel packet is. */
struct tunnel {
	__u32 l2_len;       /* 14, or 18 with an 802.1Q tag */
	__u32 outer_len;    /* bytes from the outer IP header to the inner IP header */
	__u8 inner_family;  /* enum lb_family */
	__u8 outer_family;
	__u8 kind;          /* LB_DECAP_IPIP or LB_DECAP_GUE */
	__u8 pad;
	__u32 dst[4];       /* the outer destination address */
	__u32 off;          /* between tunnel_outer and tunnel_inner: the offset reached so far */
};

/* Walks the outer IPv6 extension headers from `*off` (the first one announced by `*nh`) to the
 * header that follows them, leaving *off and *nh there. Hop-by-hop and destination options are
 * skipped. The rest is left to the stack: a fragment (reassembly comes first, as for IPv4), AH (the
 * stack authenticates), a routing header with segments left (we are not yet the final
 * destination), and a chain longer than PARSE_MAX_EXT_HDRS or cut short. */
static __always_inline int tunnel_skip_ext_hdrs(void *data, void *data_end, __u32 *off, __u8 *nh)
{
	for (int i = 0; i < PARSE_MAX_EXT_HDRS; i++) {
		__u32 at = *off;
		__u8 *ext;

		if (*nh != IPPROTO_HOPOPTS && *nh != IPPROTO_DSTOPTS && *nh != IPPROTO_ROUTING)
			break;
		if (at > TUNNEL_MAX_OUTER_OFF)
			return LB_DECAP_PASS_NOT_ENCAP;
		ext = data + at;
		if ((void *)(ext + 8) > data_end)
			return LB_DECAP_PASS_NOT_ENCAP;
		if (*nh == IPPROTO_ROUTING && ext[3])
			return LB_DECAP_PASS_NOT_LOCAL;
		*nh = ext[0];
		*off = at + (ext[1] + 1) * 8;
	}
	if (is_ext_hdr(*nh) || *off > TUNNEL_MAX_OUTER_OFF)
		return LB_DECAP_PASS_NOT_ENCAP;
	return PARSE_OK;
}

static __always_inline __u8 ipip_family(__u8 proto)
{
	if (proto == IPPROTO_IPIP)
		return LB_AF_INET;
	if (proto == IPPROTO_IPV6)
		return LB_AF_INET6;
	return 0;
}

/* The outer headers: fills t's outer family, kind, destination and the offset of the UDP payload
 * (GUE) or the inner packet (IPIP); returns PARSE_OK or the enum lb_decap_reason that ends the
 * packet. gue_port is host order. */
static __always_inline int tunnel_outer(void *data, void *data_end, __u32 frame_len, __u16 gue_port,
					struct tunnel *t)
{
	struct packet pkt = {};
	__u32 off;
	__u8 proto;

	pkt.frame_len = frame_len;
	if (parse_eth(data, data_end, &pkt) != PARSE_OK)
		return LB_DECAP_PASS_NOT_ENCAP;
	t->l2_len = pkt.l2_len == PARSE_ETH_LEN ? PARSE_ETH_LEN : PARSE_ETH_LEN + PARSE_VLAN_LEN;
	t->outer_family = pkt.flow.family;
	if (t->outer_family == LB_AF_INET) {
		struct iphdr *ip = data + t->l2_len;

		if ((void *)(ip + 1) > data_end)
			return LB_DECAP_PASS_NOT_ENCAP;
		if (ip->version != 4 || ip->ihl < 5)
			return LB_DECAP_PASS_NOT_ENCAP;
		if (ip->frag_off & bpf_htons(IP4_MF | IP4_OFFSET))
			return LB_DECAP_PASS_NOT_ENCAP; /* the stack reassembles first */
		proto = ip->protocol;
		t->dst[0] = ip->daddr;
		off = t->l2_len + ip->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = data + t->l2_len;
		int r;

		if ((void *)(ip6 + 1) > data_end)
			return LB_DECAP_PASS_NOT_ENCAP;
		proto = ip6->nexthdr;
		__builtin_memcpy(t->dst, &ip6->daddr, 16);
		off = t->l2_len + sizeof(*ip6);
		r = tunnel_skip_ext_hdrs(data, data_end, &off, &proto);
		if (r != PARSE_OK)
			return r;
	}

	if (ipip_family(proto)) {
		t->kind = LB_DECAP_IPIP;
		t->inner_family = ipip_family(proto);
	} else if (proto == IPPROTO_UDP) {
		struct udphdr *udp = data + (off & 0x1ff);

		if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(gue_port))
			return LB_DECAP_PASS_NOT_ENCAP;
		t->kind = LB_DECAP_GUE;
		off += sizeof(*udp);
	} else {
		return LB_DECAP_PASS_NOT_ENCAP;
	}
	t->off = off;
	return PARSE_OK;
}

/* After tunnel_outer: reads the GUE header, checks that the inner header is there and is what the
 * outer headers announced, and sets t->outer_len; returns PARSE_OK or the enum lb_decap_reason. */
static __always_inline int tunnel_inner(void *data, void *data_end, struct tunnel *t)
{
	__u32 off = t->off;

	if (t->kind == LB_DECAP_GUE) {
		__u8 *gue = data + (off & 0x1ff);

		if ((void *)(gue + LB_GUE_HDR_LEN) > data_end)
			return LB_DECAP_DROP_MALFORMED;
		switch (gue[0] >> LB_GUE_VERSION_SHIFT) {
		case 1: /* variant 1: the IP header itself; its version nibble says which */
			t->inner_family = gue[0] >> 4 == 4 ? LB_AF_INET : gue[0] >> 4 == 6 ? LB_AF_INET6 : 0;
			break;
		case 0: /* variant 0: 4-byte header, optional fields, then the protocol it names */
			if (gue[0] & LB_GUE_C_BIT)
				return LB_DECAP_PASS_GUE_CONTROL; /* see decap.bpf.c */
			t->inner_family = ipip_family(gue[1]);
			off += LB_GUE_HDR_LEN + (gue[0] & LB_GUE_HLEN_MASK) * 4;
			break;
		default:
			return LB_DECAP_DROP_MALFORMED;
		}
		if (!t->inner_family)
			return LB_DECAP_DROP_MALFORMED;
	}
	if (off > TUNNEL_MAX_HDRS)
		return LB_DECAP_DROP_MALFORMED;
	{
		__u8 *inner = data + off;
		__u32 need = t->inner_family == LB_AF_INET ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);

		if ((void *)(inner + need) > data_end || inner[0] >> 4 != t->inner_family)
			return LB_DECAP_DROP_MALFORMED;
	}
	t->outer_len = off - t->l2_len;
	return PARSE_OK;
}

#endif
