/* encap.h: wraps the client's IP packet for a real: IPIP (4in4, 6in6, 4in6) or GUE variant 1 / 0 over IPv4 or IPv6.
 *
 * Choices made here, all visible to the reals and to anything on the path:
 * - Outer TTL / hop limit is 64: the tunnel is a new hop, not a continuation of the client's TTL.
 * - Outer IPv4 sets DF and ID 0 (RFC 6864): fragments never leave the LB; when the encapsulated
 *   packet would exceed settings.mtu the balancer answers the client with frag-needed / packet
 *   too big instead (icmp.h), advertising mtu minus the overhead computed by encap_overhead().
 * - Inner DSCP and ECN are copied to the outer header (RFC 6040 "normal mode").
 * - The outer IPv6 flow label carries 20 bits of the flow hash (RFC 6438), one label per flow.
 * - Outer source: settings.src4 / src6, or with LB_VIP_OUTER_SRC_FLOW the flow hash fills the host
 *   bits given by settings.src4_mask / src6_mask (RSS entropy for the reals' NICs).
 * - GUE: UDP source port 49152 + 14 bits of the flow hash (the RFC 6335 dynamic range), destination
 *   settings.gue_port. The outer UDP checksum is computed, over IPv4 and IPv6, unless the VIP has
 *   LB_VIP_GUE_CSUM_ZERO: then it is 0 (RFC 768 allows it over IPv4; over IPv6 only the operator's
 *   opt-in makes it acceptable, RFC 6935/6936, and the reals must accept zero checksums).
 *   Variant 0 adds the 4-byte header version 0, C 0, hlen 0, proto/ctype = 4 (IPv4) or 41 (IPv6), flags 0.
 * - Ethernet: destination settings.nexthop_mac, source the input frame's destination MAC; an
 *   802.1Q tag on the input is kept on the output.
 */
#ifndef L4LAB_ENCAP_H
#define L4LAB_ENCAP_H

#include "parse.h"
#include "csum.h"
#include "hash.h"

enum encap_constants {
	ENCAP_TTL = 64,
	ENCAP_GUE_HDR_LEN = 4,
	ENCAP_GUE_SPORT_BASE = 0xc000, /* 49152 */
	ENCAP_GUE_SPORT_MASK = 0x3fff,
	ENCAP_FLOW_LABEL_MASK = 0xfffff,
};

/* Bytes added in front of the inner IP packet for this encapsulation towards a real of this family. */
static __always_inline __u32 encap_overhead(__u8 mode, __u8 real_family)
{
	__u32 len = real_family == LB_AF_INET6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);

	if (mode == LB_ENCAP_GUE1 || mode == LB_ENCAP_GUE0)
		len += sizeof(struct udphdr);
	if (mode == LB_ENCAP_GUE0)
		len += ENCAP_GUE_HDR_LEN;
	return len;
}

static __always_inline __u32 encap_src4(const struct lb_settings *s, __u32 vip_flags, __u32 hash)
{
	if (!(vip_flags & LB_VIP_OUTER_SRC_FLOW))
		return s->src4;
	return (s->src4 & ~s->src4_mask) | (bpf_htonl(hash) & s->src4_mask);
}

static __always_inline void encap_src6(__u32 *out, const struct lb_settings *s, __u32 vip_flags, __u32 hash)
{
	for (int i = 0; i < 4; i++) {
		if (vip_flags & LB_VIP_OUTER_SRC_FLOW)
			out[i] = (s->src6[i] & ~s->src6_mask[i]) |
				 (bpf_htonl(hash_final(hash + i)) & s->src6_mask[i]);
		else
			out[i] = s->src6[i];
	}
}

/* Writes the saved L2 header at the new frame start with the next-hop MAC and the outer ethertype. */
static __always_inline int encap_write_l2(void *data, void *data_end, const __u8 *old_l2, __u32 l2_len,
					  const struct lb_settings *s, __be16 ethertype)
{
	struct ethhdr *eth = data;

	if (data + PARSE_L2_MAX > data_end)
		return -1;
	__builtin_memcpy(eth->h_dest, s->nexthop_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, old_l2, ETH_ALEN); /* the input's destination MAC */
	if (l2_len == PARSE_ETH_LEN + PARSE_VLAN_LEN) {
		struct vlan_hdr *vlan = (void *)(eth + 1);

		__builtin_memcpy(&eth->h_proto, old_l2 + 12, 4); /* TPID and TCI */
		vlan->proto = ethertype;
	} else {
		eth->h_proto = ethertype;
	}
	return 0;
}

/* Encapsulates the parsed packet for `real`; returns LB_TX_ENCAP or LB_DROP_ENCAP_FAILED. */
static __always_inline int encap_packet(struct xdp_md *ctx, const struct packet *pkt, const struct lb_real *real,
					__u8 mode, __u32 hash, const struct lb_settings *s, __u32 vip_flags)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l2_len = pkt->l2_len == PARSE_ETH_LEN ? PARSE_ETH_LEN : PARSE_ETH_LEN + PARSE_VLAN_LEN;
	__u32 overhead = encap_overhead(mode, real->family);
	__u8 inner_proto = pkt->flow.family == LB_AF_INET ? IPPROTO_IPIP : IPPROTO_IPV6;
	__u8 gue = mode == LB_ENCAP_GUE1 || mode == LB_ENCAP_GUE0;
	__u8 outer_proto = gue ? IPPROTO_UDP : inner_proto;
	__u32 udp_len = pkt->ip_len + overhead -
			(real->family == LB_AF_INET6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
	__u16 sport = bpf_htons(ENCAP_GUE_SPORT_BASE | (hash & ENCAP_GUE_SPORT_MASK));
	__u8 old_l2[PARSE_L2_MAX];
	void *hdr;

	if (data + PARSE_L2_MAX > data_end)
		return LB_DROP_ENCAP_FAILED;
	__builtin_memcpy(old_l2, data, PARSE_L2_MAX);
	if (bpf_xdp_adjust_head(ctx, -(int)overhead))
		return LB_DROP_ENCAP_FAILED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;

	if (real->family == LB_AF_INET6) {
		struct ipv6hdr ip6 = {};
		__u32 word0 = (6U << 28) | ((__u32)pkt->tos << 20) | (hash & ENCAP_FLOW_LABEL_MASK);

		if (encap_write_l2(data, data_end, old_l2, l2_len, s, bpf_htons(ETH_P_IPV6)))
			return LB_DROP_ENCAP_FAILED;
		*(__be32 *)&ip6 = bpf_htonl(word0);
		ip6.payload_len = bpf_htons(udp_len);
		ip6.nexthdr = outer_proto;
		ip6.hop_limit = ENCAP_TTL;
		encap_src6((__u32 *)&ip6.saddr, s, vip_flags, hash);
		__builtin_memcpy(&ip6.daddr, real->addr, 16);
		hdr = data + l2_len;
		if (hdr + sizeof(ip6) > data_end)
			return LB_DROP_ENCAP_FAILED;
		__builtin_memcpy(hdr, &ip6, sizeof(ip6));
		hdr += sizeof(ip6);
	} else {
		struct iphdr ip = {};

		if (encap_write_l2(data, data_end, old_l2, l2_len, s, bpf_htons(ETH_P_IP)))
			return LB_DROP_ENCAP_FAILED;
		ip.version = 4;
		ip.ihl = 5;
		ip.tos = pkt->tos;
		ip.tot_len = bpf_htons(pkt->ip_len + overhead);
		ip.frag_off = bpf_htons(IP4_DF);
		ip.ttl = ENCAP_TTL;
		ip.protocol = outer_proto;
		ip.saddr = encap_src4(s, vip_flags, hash);
		ip.daddr = real->addr[0];
		ip.check = csum_ipv4_header(&ip);
		hdr = data + l2_len;
		if (hdr + sizeof(ip) > data_end)
			return LB_DROP_ENCAP_FAILED;
		__builtin_memcpy(hdr, &ip, sizeof(ip));
		hdr += sizeof(ip);
	}
	if (!gue)
		return LB_TX_ENCAP;

	struct udphdr *udp = hdr;
	__u64 sum;
	__s64 inner_sum;

	if ((void *)(udp + 1) + ENCAP_GUE_HDR_LEN > data_end)
		return LB_DROP_ENCAP_FAILED;
	udp->source = sport;
	udp->dest = s->gue_port;
	udp->len = bpf_htons(udp_len);
	udp->check = 0;
	if (mode == LB_ENCAP_GUE0) {
		__u8 *gh = (void *)(udp + 1);

		gh[0] = 0;
		gh[1] = inner_proto;
		gh[2] = 0;
		gh[3] = 0;
	}
	if (vip_flags & LB_VIP_GUE_CSUM_ZERO)
		return LB_TX_ENCAP;

	/* UDP checksum over the pseudo-header, the UDP (and GUE) header and the inner packet. */
	inner_sum = csum_region(ctx, l2_len + overhead, pkt->ip_len);
	if (inner_sum < 0)
		return LB_DROP_ENCAP_FAILED;
	sum = (__u64)inner_sum;
	if (real->family == LB_AF_INET6) {
		__u32 src[4];

		encap_src6(src, s, vip_flags, hash);
		sum += csum_words(src, 8);
		sum += csum_words(real->addr, 8);
	} else {
		__u32 src4 = encap_src4(s, vip_flags, hash);

		sum += csum_words(&src4, 2);
		sum += csum_words(real->addr, 2);
	}
	sum += bpf_htons(udp_len) * 2; /* pseudo-header length and UDP length field */
	sum += bpf_htons(IPPROTO_UDP);
	sum += sport;
	sum += s->gue_port;
	if (mode == LB_ENCAP_GUE0)
		sum += bpf_htons(inner_proto);

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	udp = data + l2_len + (real->family == LB_AF_INET6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
	if ((void *)(udp + 1) > data_end)
		return LB_DROP_ENCAP_FAILED;
	udp->check = csum_fold(sum);
	if (!udp->check)
		udp->check = 0xffff;
	return LB_TX_ENCAP;
}

#endif
