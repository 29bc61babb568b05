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
 * - GUE (gue.h): UDP source port 49152 + 14 bits of the flow hash (the RFC 6335 dynamic range),
 *   destination settings.gue_port. The outer UDP checksum is computed, over IPv4 and IPv6, unless the VIP has
 *   LB_VIP_GUE_CSUM_ZERO: then it is 0 (RFC 768 allows it over IPv4; over IPv6 only the operator's
 *   opt-in makes it acceptable, RFC 6935/6936, and the reals must accept zero checksums).
 *   For an inner TCP or UDP packet (IPv4, or IPv6 without extension headers) the payload is not read:
 *   its own valid L4 checksum makes the segment sum to the complement of its pseudo-header, so the
 *   outer sum needs only headers (local checksum offload, as the kernel does for UDP tunnels), and for
 *   IPv4 not even the inner header's words: with its checksum it sums to 0xffff. The outer checksum is
 *   then right exactly when the inner packet is intact: one that arrives corrupted is dropped by the
 *   real's UDP instead of its IP or TCP. Anything else is summed byte by byte.
 *   Variant 0 adds the 4-byte header version 0, C 0, hlen 0, proto/ctype = 4 (IPv4) or 41 (IPv6), flags 0.
 * encap_packet makes the room and keeps the L2 header; encap_ip6 / encap_ip4 write the outer IP
 * header of the real's family; encap_gue writes UDP (and GUE) and the UDP checksum.
 * - Ethernet: destination settings.nexthop_mac, source the input frame's destination MAC (two-arm:
 *   balancer.bpf.c's egress_of() puts the egress interface's there); an 802.1Q tag on the input is
 *   kept on the output, also when it leaves by the egress arm.
 */
#ifndef L4LAB_ENCAP_H
#define L4LAB_ENCAP_H

#include "parse.h"
#include "csum.h"
#include "csum_frame.h"
#include "gue.h"
#include "hash.h"

enum encap_constants {
	ENCAP_FLOW_LABEL_MASK = 0xfffff,
};

/* Bytes added in front of the inner IP packet for this encapsulation towards a real of this family. */
static __always_inline __u32 encap_overhead(__u8 mode, __u8 real_family)
{
	__u32 len = real_family == LB_AF_INET6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);

	if (mode == LB_ENCAP_GUE1 || mode == LB_ENCAP_GUE0)
		len += sizeof(struct udphdr);
	if (mode == LB_ENCAP_GUE0)
		len += LB_GUE_HDR_LEN;
	return len;
}

static __always_inline __u32 encap_src4(const struct lb_settings *s, __u32 vip_flags, __u32 hash)
{
	if (!(vip_flags & LB_VIP_OUTER_SRC_FLOW))
		return s->src4;
	return (s->src4 & ~s->src4_mask) | (bpf_htonl(hash) & s->src4_mask);
}

/* An IPv6 address as four 32-bit words, network order. */
struct addr6_words {
	__u32 w[4];
};

/* The flow-derived IPv6 outer source (LB_VIP_OUTER_SRC_FLOW). A global function: inlined, its four
 * interleaved hash_final()s are spilled to the stack of forward()'s callers, deeper than the
 * verifier's 512 bytes allow. */
__noinline int encap_src6_flow(struct addr6_words *out, const struct lb_settings *s, __u32 hash)
{
	if (!out || !s)
		return -1; /* never: the caller passes its stack and a map value */
	for (int i = 0; i < 4; i++)
		out->w[i] = (s->src6[i] & ~s->src6_mask[i]) | (bpf_htonl(hash_final(hash + i)) & s->src6_mask[i]);
	return 0;
}

static __always_inline void encap_src6(__u32 *out, const struct lb_settings *s, __u32 vip_flags, __u32 hash)
{
	struct addr6_words src;

	if (vip_flags & LB_VIP_OUTER_SRC_FLOW) {
		encap_src6_flow(&src, s, hash);
		for (int i = 0; i < 4; i++)
			out[i] = src.w[i];
		return;
	}
	for (int i = 0; i < 4; i++)
		out[i] = s->src6[i];
}

/* Writes the L2 header at the new frame start: the next-hop MAC; as source, the input's destination
 * MAC (two-arm: egress_of() writes the egress's over it); the input's VLAN tag if it had one; the outer
 * ethertype. The input's L2 header is read where bpf_xdp_adjust_head() left it, `overhead` bytes into
 * the new frame (overhead >= 20 > 18, the longest L2 header: the two do not overlap), so that nothing
 * is held across the helper call.
 * Read and written as 32- and 16-bit words: through the packed struct ethhdr (or a memcpy to a
 * packet pointer) clang moves each byte on its own, a load, shift and or per byte read. The verifier
 * allows unaligned packet access where the architecture has efficient unaligned access (x86-64,
 * arm64), and the JIT makes each word one instruction. */
static __always_inline int encap_write_l2(void *data, void *data_end, __u32 l2_len, __u32 overhead,
					  const struct lb_settings *s, __be16 ethertype)
{
	void *old = data + (overhead & 0x7f);

	if (data + PARSE_L2_MAX > data_end || old + PARSE_L2_MAX > data_end)
		return -1;
	*(__u32 *)(data + 6) = *(const __u32 *)old;
	*(__u16 *)(data + 10) = *(const __u16 *)(old + 4);
	*(__u32 *)data = *(const __u32 *)s->nexthop_mac;
	*(__u16 *)(data + 4) = *(const __u16 *)(s->nexthop_mac + 4);
	if (l2_len == PARSE_ETH_LEN + PARSE_VLAN_LEN) {
		*(__u32 *)(data + 12) = *(const __u32 *)(old + 12);
		*(__be16 *)(data + 16) = ethertype;
	} else {
		*(__be16 *)(data + 12) = ethertype;
	}
	return 0;
}

/* What the outer headers of one packet are made of (the arguments encap_packet passes down). */
struct encap_args {
	const struct packet *pkt;
	const struct lb_real *real;
	const struct lb_settings *s;
	__u32 hash;
	__u32 vip_flags;
	__u32 l2_len;
	__u32 overhead;
	__u32 udp_len;     /* the outer IP payload length (UDP length for GUE) */
	__be16 sport;      /* GUE UDP source port */
	__u8 outer_proto;  /* IPPROTO_UDP for GUE, else inner_proto */
	__u8 inner_proto;  /* IPPROTO_IPIP or IPPROTO_IPV6 */
};

/* The outer IP headers are written straight into the packet in 32-bit words (see encap_write_l2),
 * from values held in registers: built on the stack first, they would cost the copy and stack
 * space that the frames of forward()'s callers do not have to spare (the verifier's 512 bytes). */

/* Writes the L2 header and the outer IPv6 header at the new frame start; returns 0, or -1 when
 * the frame is too short. */
static __always_inline int encap_ip6(void *data, void *data_end, const struct encap_args *a)
{
	__u32 word0 = (6U << 28) | ((__u32)a->pkt->tos << 20) | (a->hash & ENCAP_FLOW_LABEL_MASK);
	__u32 *hdr;

	if (encap_write_l2(data, data_end, a->l2_len, a->overhead, a->s, bpf_htons(ETH_P_IPV6)))
		return -1;
	hdr = data + a->l2_len;
	if ((void *)hdr + sizeof(struct ipv6hdr) > data_end)
		return -1;
	hdr[0] = bpf_htonl(word0);
	/* payload length, next header, hop limit (little-endian word: the first byte lowest) */
	hdr[1] = bpf_htons(a->udp_len) | (__u32)a->outer_proto << 16 | (__u32)LB_OUTER_TTL << 24;
	encap_src6(hdr + 2, a->s, a->vip_flags, a->hash);
	for (int i = 0; i < 4; i++)
		hdr[6 + i] = a->real->addr[i];
	return 0;
}

/* The sum of a 32-bit word's two 16-bit halves (in packet byte order), for a header's checksum. */
static __always_inline __u64 csum_word32(__u32 w)
{
	return (w & 0xffff) + (w >> 16);
}

/* The same for an IPv4 real: DF set, ID 0, the header checksum computed. */
static __always_inline int encap_ip4(void *data, void *data_end, const struct encap_args *a)
{
	/* version 4, IHL 5, TOS, total length; ID 0, flags DF; TTL, protocol, checksum 0 */
	__u32 w0 = 0x45 | (__u32)a->pkt->tos << 8 | (__u32)bpf_htons(a->pkt->ip_len + a->overhead) << 16;
	__u32 w1 = (__u32)bpf_htons(IP4_DF) << 16;
	__u32 w2 = LB_OUTER_TTL | (__u32)a->outer_proto << 8;
	__u32 src = encap_src4(a->s, a->vip_flags, a->hash), dst = a->real->addr[0];
	__u32 *hdr;

	if (encap_write_l2(data, data_end, a->l2_len, a->overhead, a->s, bpf_htons(ETH_P_IP)))
		return -1;
	hdr = data + a->l2_len;
	if ((void *)hdr + sizeof(struct iphdr) > data_end)
		return -1;
	w2 |= (__u32)csum_fold32(csum_word32(w0) + csum_word32(w1) + csum_word32(w2) + csum_word32(src) +
			       csum_word32(dst)) << 16;
	hdr[0] = w0;
	hdr[1] = w1;
	hdr[2] = w2;
	hdr[3] = src;
	hdr[4] = dst;
	return 0;
}

/* The ones' complement sum of the inner IP packet (already in place at inner_off, behind the outer
 * headers) from its headers alone: its IP header's words, plus the complement of its L4 pseudo-header,
 * which is what an intact TCP / UDP segment with its checksum sums to. -1 where that does not hold:
 * other protocols (ICMP answers and steered errors), UDP without a checksum, IPv6 extension headers.
 * For IPv4 (inner_sum_from_headers) the header's own words are not read either: with its checksum an
 * intact header sums to 0xffff, nothing in ones' complement arithmetic. The outer checksum is then
 * right exactly when the inner packet is intact, header and segment; one damaged on the way in is
 * dropped by the real's UDP instead of its IP or TCP.
 * The IPv6 case is a global function: the verifier checks it once, not on every path of forward(). */
__noinline __s64 inner6_sum_from_headers(struct xdp_md *ctx, const struct packet *pkt, __u32 inner_off)
{
	void *data_end = (void *)(long)ctx->data_end;
	void *ip = (void *)(long)ctx->data + (inner_off & 0x7f);
	__u32 hdr_len;
	__u64 sum, pseudo;
	__u8 proto;

	if (!pkt)
		return -1;
	proto = pkt->flow.proto;
	hdr_len = pkt->l4_off - pkt->l2_len;
	if ((proto != IPPROTO_TCP && (proto != IPPROTO_UDP || pkt->udp_csum_zero)) ||
	    hdr_len != sizeof(struct ipv6hdr) || ip + sizeof(struct ipv6hdr) > data_end)
		return -1;
	sum = csum_words(ip, sizeof(struct ipv6hdr) / 2);
	/* both addresses, the 32-bit length, three zero bytes, the next header */
	pseudo = csum_words(pkt->flow.src, 8) + csum_words(pkt->flow.dst, 8);
	pseudo += bpf_htons(proto) + bpf_htons(pkt->ip_len - hdr_len);
	return sum + csum_fold(pseudo); /* csum_fold complements: ~pseudo, what the segment sums to */
}

static __always_inline __s64 inner_sum_from_headers(struct xdp_md *ctx, const struct packet *pkt, __u32 inner_off)
{
	__u32 hdr_len = pkt->l4_off - pkt->l2_len;
	__u8 proto = pkt->flow.proto;
	__u64 pseudo;

	if (pkt->flow.family != LB_AF_INET)
		return inner6_sum_from_headers(ctx, pkt, inner_off);
	if ((proto != IPPROTO_TCP && (proto != IPPROTO_UDP || pkt->udp_csum_zero)) || hdr_len != sizeof(struct iphdr))
		return -1;
	/* both addresses, a zero byte, the protocol, the 16-bit length: six words */
	pseudo = csum_words(pkt->flow.src, 2) + csum_words(pkt->flow.dst, 2);
	pseudo += bpf_htons(proto) + bpf_htons(pkt->ip_len - hdr_len);
	return csum_negate8(pseudo); /* what the segment sums to, left for encap_gue's one fold */
}

/* Writes the UDP (and variant-0 GUE) header at udp and fills in the UDP checksum, over the
 * pseudo-header, the UDP (and GUE) header and the inner packet, unless the VIP asks for zero. */
static __always_inline int encap_gue(struct xdp_md *ctx, struct udphdr *udp, void *data_end, __u8 mode,
				     const struct encap_args *a)
{
	__u64 sum;
	__s64 inner_sum;

	if ((void *)(udp + 1) + LB_GUE_HDR_LEN > data_end)
		return LB_DROP_ENCAP_FAILED;
	udp->source = a->sport;
	udp->dest = a->s->gue_port;
	udp->len = bpf_htons(a->udp_len);
	udp->check = 0;
	if (mode == LB_ENCAP_GUE0)
		gue_write_v0(udp + 1, a->inner_proto);
	if (a->vip_flags & LB_VIP_GUE_CSUM_ZERO)
		return LB_TX_ENCAP;

	inner_sum = inner_sum_from_headers(ctx, a->pkt, a->l2_len + a->overhead);
	if (inner_sum < 0)
		inner_sum = csum_region(ctx, a->l2_len + a->overhead, a->pkt->ip_len);
	if (inner_sum < 0)
		return LB_DROP_ENCAP_FAILED;
	sum = (__u64)inner_sum;
	if (a->real->family == LB_AF_INET6) {
		__u32 src[4];

		encap_src6(src, a->s, a->vip_flags, a->hash);
		sum += csum_words(src, 8);
		sum += csum_words(a->real->addr, 8);
	} else {
		__u32 src4 = encap_src4(a->s, a->vip_flags, a->hash);

		sum += csum_words(&src4, 2);
		sum += csum_words(a->real->addr, 2);
	}
	sum += bpf_htons(a->udp_len) * 2; /* pseudo-header length and UDP length field */
	sum += bpf_htons(IPPROTO_UDP);
	sum += a->sport;
	sum += a->s->gue_port;
	if (mode == LB_ENCAP_GUE0)
		sum += bpf_htons(a->inner_proto);

	/* csum_region may have moved the packet: find the UDP header again. */
	data_end = (void *)(long)ctx->data_end;
	udp = (void *)(long)ctx->data + a->l2_len +
	      (a->real->family == LB_AF_INET6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
	if ((void *)(udp + 1) > data_end)
		return LB_DROP_ENCAP_FAILED;
	udp->check = csum_fold(sum);
	if (!udp->check)
		udp->check = 0xffff;
	return LB_TX_ENCAP;
}

/* Encapsulates the parsed packet for `real`; returns LB_TX_ENCAP or LB_DROP_ENCAP_FAILED. */
static __always_inline int encap_packet(struct xdp_md *ctx, const struct packet *pkt, const struct lb_real *real,
					__u8 mode, __u32 hash, const struct lb_settings *s, __u32 vip_flags)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u8 gue = mode == LB_ENCAP_GUE1 || mode == LB_ENCAP_GUE0;
	struct encap_args a = {
		.pkt = pkt, .real = real, .s = s, .hash = hash, .vip_flags = vip_flags,
		.l2_len = pkt->l2_len == PARSE_ETH_LEN ? PARSE_ETH_LEN : PARSE_ETH_LEN + PARSE_VLAN_LEN,
		.overhead = encap_overhead(mode, real->family),
		.inner_proto = pkt->flow.family == LB_AF_INET ? IPPROTO_IPIP : IPPROTO_IPV6,
	};
	void *hdr;

	a.outer_proto = gue ? IPPROTO_UDP : a.inner_proto;
	a.udp_len = pkt->ip_len + a.overhead -
		    (real->family == LB_AF_INET6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr));
	a.sport = gue_sport(hash);
	if (bpf_xdp_adjust_head(ctx, -(int)a.overhead))
		return LB_DROP_ENCAP_FAILED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (real->family == LB_AF_INET6) {
		if (encap_ip6(data, data_end, &a))
			return LB_DROP_ENCAP_FAILED;
		hdr = data + a.l2_len + sizeof(struct ipv6hdr);
	} else {
		if (encap_ip4(data, data_end, &a))
			return LB_DROP_ENCAP_FAILED;
		hdr = data + a.l2_len + sizeof(struct iphdr);
	}
	if (!gue)
		return LB_TX_ENCAP;
	return encap_gue(ctx, hdr, data_end, mode, &a);
}

#endif
