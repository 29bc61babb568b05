/* icmp.h: ICMP and ICMPv6 for the balancer: echo replies for VIPs, too-big answers, and reading the flow an error quotes. */
#ifndef L4LAB_ICMP_H
#define L4LAB_ICMP_H

#include "parse.h"
#include "csum.h"
#include "csum_frame.h"
#include "gue.h"

/* <linux/icmp.h> does not build for -target bpf with Debian's headers; the few fields needed here. */
struct icmp4_hdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u16 id_or_unused;
	__u16 seq_or_mtu; /* frag-needed: next-hop MTU */
};

struct icmp6_hdr {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u32 data; /* packet too big: MTU */
};

enum icmp_types {
	ICMP4_ECHO_REPLY = 0,
	ICMP4_DEST_UNREACH = 3,
	ICMP4_ECHO_REQUEST = 8,
	ICMP4_TIME_EXCEEDED = 11,
	ICMP4_FRAG_NEEDED_CODE = 4,
	ICMP6_DEST_UNREACH = 1,
	ICMP6_PACKET_TOO_BIG = 2,
	ICMP6_TIME_EXCEEDED = 3,
	ICMP6_ECHO_REQUEST = 128,
	ICMP6_ECHO_REPLY = 129,
	ICMP4_QUOTE_TOTAL = 576,  /* RFC 1812: an ICMPv4 error is at most 576 bytes */
	ICMP6_QUOTE_TOTAL = 1280, /* RFC 4443: an ICMPv6 error is at most the minimum MTU */
};

/* Reading the packet an error quotes. */
enum icmp_quote_limits {
	ICMP_QUOTE_MAX_OFF = PARSE_MAX_L4_OFF + 128, /* frame offset past which no quoted header is read */
	ICMP6_RH_TYPE_HOME = 2,  /* routing header type 2 (RFC 6275): one address, the final one */
	ICMP6_RH_TYPE_SRH = 4,   /* segment routing header (RFC 8754): segment 0 is the final one */
	ICMP6_RH_ADDR_OFF = 8,   /* where both keep that address */
	ICMP6_FRAG_OFFSET_MASK = 0xfff8,
};

static __always_inline int icmp4_is_error(__u8 type)
{
	return type == ICMP4_DEST_UNREACH || type == ICMP4_TIME_EXCEEDED;
}

static __always_inline int icmp6_is_error(__u8 type)
{
	return type == ICMP6_DEST_UNREACH || type == ICMP6_PACKET_TOO_BIG || type == ICMP6_TIME_EXCEEDED;
}

static __always_inline void swap_macs(struct ethhdr *eth)
{
	__u8 tmp[ETH_ALEN];

	__builtin_memcpy(tmp, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, tmp, ETH_ALEN);
}

/* Whether the ICMP / ICMPv6 message of pkt sums right (ICMPv6 with its pseudo-header). A request whose
 * checksum is wrong gets no reply, as from the kernel's stack: an IPv4 reply is summed afresh and
 * would carry a right checksum for a damaged request. A global function: echo is off the forwarding
 * path. */
__noinline int icmp_checksum_ok(struct xdp_md *ctx, const struct packet *pkt)
{
	__u32 len;
	__s64 sum;

	if (!pkt)
		return 0;
	len = pkt->ip_len - (pkt->l4_off - pkt->l2_len);
	sum = csum_region(ctx, pkt->l4_off, len);
	if (sum < 0)
		return 0;
	if (pkt->flow.family == LB_AF_INET6)
		sum += csum_words(pkt->flow.src, 8) + csum_words(pkt->flow.dst, 8) + bpf_htons(len) +
		       bpf_htons(IPPROTO_ICMPV6);
	return csum_fold(sum) == 0;
}

/* Turns an echo request into its reply in place (addresses and MACs swapped, TTL 64). */
static __always_inline int icmp_echo_reply(struct xdp_md *ctx, const struct packet *pkt)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return LB_DROP_MALFORMED_ETH;
	if (pkt->flow.family == LB_AF_INET) {
		struct iphdr *ip = data + (pkt->l2_len & 0x1f);
		struct icmp4_hdr *icmp = l4_header(data, data_end, pkt, sizeof(*icmp));
		__u32 tmp;

		if ((void *)(ip + 1) > data_end || !icmp)
			return LB_DROP_MALFORMED_L4;
		tmp = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = tmp;
		ip->ttl = LB_OUTER_TTL;
		ip->check = 0;
		ip->check = csum_ipv4_header(ip);
		icmp->type = ICMP4_ECHO_REPLY;
		icmp->checksum = 0;
		swap_macs(eth);
		/* Summed afresh, not updated: an all-zero reply must get 0xffff, which an RFC 1624
		 * update cannot tell from 0x0000. */
		{
			__u32 icmp_off = pkt->l4_off;
			__s64 sum = csum_region(ctx, icmp_off, pkt->ip_len - (icmp_off - pkt->l2_len));

			if (sum < 0)
				return LB_DROP_MALFORMED_L4;
			data = (void *)(long)ctx->data;
			data_end = (void *)(long)ctx->data_end;
			icmp = l4_header(data, data_end, pkt, sizeof(*icmp));
			if (!icmp)
				return LB_DROP_MALFORMED_L4;
			icmp->checksum = csum_fold(sum);
		}
		return LB_TX_ICMP_ECHO;
	} else {
		struct ipv6hdr *ip6 = data + (pkt->l2_len & 0x1f);
		struct icmp6_hdr *icmp6 = l4_header(data, data_end, pkt, sizeof(*icmp6));
		struct in6_addr tmp;

		if ((void *)(ip6 + 1) > data_end || !icmp6)
			return LB_DROP_MALFORMED_L4;
		tmp = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = tmp;
		ip6->hop_limit = LB_OUTER_TTL;
		icmp6->type = ICMP6_ECHO_REPLY;
		icmp6->checksum = csum_replace16(icmp6->checksum, bpf_htons(ICMP6_ECHO_REQUEST << 8),
						 bpf_htons(ICMP6_ECHO_REPLY << 8));
	}
	swap_macs(eth);
	return LB_TX_ICMP_ECHO;
}

enum icmp_quote_status {
	ICMP_QUOTE_UNREADABLE = 0xffffffff,
};

/* Walks the extension headers of the IPv6 packet an ICMPv6 error quotes, from `off` (the first one,
 * announced by `nh`), and sets flow->proto to the upper-layer protocol. The quote is the reply of a
 * flow (VIP -> client), so the client is its final destination: while a routing header still has
 * segments left, the IPv6 destination is only the next segment, and the final one is read from
 * the routing header instead (types 2 and 4; type 0 is deprecated by RFC 5095 and not read). A
 * fragment header is fine on the first fragment only (later ones carry no ports). Returns the
 * offset of the upper-layer header, or ICMP_QUOTE_UNREADABLE (also when the chain outruns
 * PARSE_MAX_EXT_HDRS). */
static __always_inline __u32 icmp6_quoted_ext_hdrs(void *data, void *data_end, __u32 off, __u8 nh,
						   struct lb_flow *flow)
{
	for (int i = 0; i < PARSE_MAX_EXT_HDRS; i++) {
		__u8 *ext;

		if (!is_ext_hdr(nh))
			break;
		if (off > ICMP_QUOTE_MAX_OFF)
			return ICMP_QUOTE_UNREADABLE;
		ext = data + off;
		if ((void *)(ext + 8) > data_end)
			return ICMP_QUOTE_UNREADABLE;
		if (nh == IPPROTO_FRAGMENT) {
			if (bpf_ntohs(*(__be16 *)(ext + 2)) & ICMP6_FRAG_OFFSET_MASK)
				return ICMP_QUOTE_UNREADABLE;
			off += 8;
		} else if (nh == IPPROTO_AH) {
			off += (ext[1] + 2) * 4;
		} else {
			if (nh == IPPROTO_ROUTING && ext[3]) { /* segments left */
				__u8 *final = ext + ICMP6_RH_ADDR_OFF;

				if (ext[2] != ICMP6_RH_TYPE_HOME && ext[2] != ICMP6_RH_TYPE_SRH)
					return ICMP_QUOTE_UNREADABLE;
				if ((void *)(final + 16) > data_end)
					return ICMP_QUOTE_UNREADABLE;
				__builtin_memcpy(flow->src, final, 16);
			}
			off += (ext[1] + 1) * 8;
		}
		nh = ext[0];
	}
	if (is_ext_hdr(nh))
		return ICMP_QUOTE_UNREADABLE;
	flow->proto = nh;
	return off;
}

/* Reads the flow quoted by an ICMP / ICMPv6 error and returns it reversed, i.e. as the client's
 * forward flow (client -> VIP). Needs only the quoted IP header (with its IPv6 extension headers)
 * and the 4 bytes of ports, so an error quoting 8 bytes of TCP works. Returns 0, or -1 when the
 * quote is not a readable TCP/UDP packet. */
static __always_inline int icmp_quoted_flow(void *data, void *data_end, const struct packet *pkt,
					    struct lb_flow *flow)
{
	__u32 off = pkt->l4_off + 8; /* both ICMP headers are 8 bytes */
	__u16 *ports;

	if (off > PARSE_MAX_L4_OFF)
		return -1;
	if (pkt->flow.family == LB_AF_INET) {
		struct iphdr *q = data + off;
		__u32 qlen;

		if ((void *)(q + 1) > data_end || q->version != 4 || q->ihl < 5)
			return -1;
		qlen = q->ihl * 4;
		flow->proto = q->protocol;
		flow->src[0] = q->daddr;
		flow->dst[0] = q->saddr;
		off += qlen;
	} else {
		struct ipv6hdr *q6 = data + off;

		if ((void *)(q6 + 1) > data_end || q6->version != 6)
			return -1;
		__builtin_memcpy(flow->src, &q6->daddr, 16);
		__builtin_memcpy(flow->dst, &q6->saddr, 16);
		off = icmp6_quoted_ext_hdrs(data, data_end, off + sizeof(*q6), q6->nexthdr, flow);
		if (off == ICMP_QUOTE_UNREADABLE)
			return -1;
	}
	if (flow->proto != IPPROTO_TCP && flow->proto != IPPROTO_UDP)
		return -1;
	if (off > ICMP_QUOTE_MAX_OFF)
		return -1;
	ports = data + off;
	if ((void *)(ports + 2) > data_end)
		return -1;
	flow->family = pkt->flow.family;
	flow->sport = ports[1];
	flow->dport = ports[0];
	return 0;
}

/* Answers the client that its packet is too big for the tunnel: ICMP frag-needed (IPv4) or packet
 * too big (IPv6) carrying `mtu`, from the VIP it wrote to, quoting as much of its packet as the
 * error may hold. Returns LB_TX_ICMP_TOO_BIG or LB_DROP_ENCAP_FAILED. A global function, off the
 * forwarding path: its headers are built in its own stack frame, not in the caller's. */
__noinline int icmp_send_too_big(struct xdp_md *ctx, const struct packet *pkt, __u32 mtu)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 l2_len, hdrs, quote;
	__u8 l2[PARSE_L2_MAX];
	__u64 sum;
	__s64 quote_sum;
	int v4, len_now, len_wanted;

	if (!pkt)
		return LB_DROP_ENCAP_FAILED; /* never: the caller passes its own stack */
	l2_len = pkt->l2_len == PARSE_ETH_LEN ? PARSE_ETH_LEN : PARSE_ETH_LEN + PARSE_VLAN_LEN;
	v4 = pkt->flow.family == LB_AF_INET;
	hdrs = v4 ? sizeof(struct iphdr) + sizeof(struct icmp4_hdr) : sizeof(struct ipv6hdr) + sizeof(struct icmp6_hdr);
	quote = (v4 ? ICMP4_QUOTE_TOTAL : ICMP6_QUOTE_TOTAL) - hdrs;
	if (quote > pkt->ip_len)
		quote = pkt->ip_len;
	if (data + PARSE_L2_MAX > data_end)
		return LB_DROP_ENCAP_FAILED;
	__builtin_memcpy(l2, data, PARSE_L2_MAX);
	if (bpf_xdp_adjust_head(ctx, -(int)hdrs))
		return LB_DROP_ENCAP_FAILED;
	len_now = bpf_xdp_get_buff_len(ctx);
	len_wanted = l2_len + hdrs + quote;
	if (len_wanted < len_now && bpf_xdp_adjust_tail(ctx, len_wanted - len_now))
		return LB_DROP_ENCAP_FAILED;
	quote_sum = csum_region(ctx, l2_len + hdrs, quote);
	if (quote_sum < 0)
		return LB_DROP_ENCAP_FAILED;
	sum = (__u64)quote_sum;

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + PARSE_L2_MAX > data_end)
		return LB_DROP_ENCAP_FAILED;
	{
		struct ethhdr *eth = data;

		__builtin_memcpy(eth->h_dest, l2 + ETH_ALEN, ETH_ALEN);
		__builtin_memcpy(eth->h_source, l2, ETH_ALEN);
		if (l2_len == PARSE_ETH_LEN + PARSE_VLAN_LEN)
			__builtin_memcpy(&eth->h_proto, l2 + 12, 6); /* tag and ethertype */
		else
			__builtin_memcpy(&eth->h_proto, l2 + 12, 2);
	}
	if (v4) {
		struct iphdr ip = {};
		struct icmp4_hdr icmp = {};
		void *hdr = data + l2_len;

		ip.version = 4;
		ip.ihl = 5;
		ip.tot_len = bpf_htons(hdrs + quote);
		ip.ttl = LB_OUTER_TTL;
		ip.protocol = IPPROTO_ICMP;
		ip.saddr = pkt->flow.dst[0];
		ip.daddr = pkt->flow.src[0];
		ip.check = csum_ipv4_header(&ip);
		icmp.type = ICMP4_DEST_UNREACH;
		icmp.code = ICMP4_FRAG_NEEDED_CODE;
		icmp.seq_or_mtu = bpf_htons(mtu);
		sum += csum_words(&icmp, 4);
		icmp.checksum = csum_fold(sum);
		if (hdr + sizeof(ip) + sizeof(icmp) > data_end)
			return LB_DROP_ENCAP_FAILED;
		__builtin_memcpy(hdr, &ip, sizeof(ip));
		__builtin_memcpy(hdr + sizeof(ip), &icmp, sizeof(icmp));
	} else {
		struct ipv6hdr ip6 = {};
		struct icmp6_hdr icmp6 = {};
		void *hdr = data + l2_len;
		__u32 plen = sizeof(icmp6) + quote;

		*(__be32 *)&ip6 = bpf_htonl(6U << 28);
		ip6.payload_len = bpf_htons(plen);
		ip6.nexthdr = IPPROTO_ICMPV6;
		ip6.hop_limit = LB_OUTER_TTL;
		__builtin_memcpy(&ip6.saddr, pkt->flow.dst, 16);
		__builtin_memcpy(&ip6.daddr, pkt->flow.src, 16);
		icmp6.type = ICMP6_PACKET_TOO_BIG;
		icmp6.data = bpf_htonl(mtu);
		sum += csum_words(&icmp6, 4);
		sum += csum_words(&ip6.saddr, 16); /* pseudo-header: both addresses */
		sum += bpf_htons(plen) + bpf_htons(IPPROTO_ICMPV6);
		icmp6.checksum = csum_fold(sum);
		if (hdr + sizeof(ip6) + sizeof(icmp6) > data_end)
			return LB_DROP_ENCAP_FAILED;
		__builtin_memcpy(hdr, &ip6, sizeof(ip6));
		__builtin_memcpy(hdr + sizeof(ip6), &icmp6, sizeof(icmp6));
	}
	return LB_TX_ICMP_TOO_BIG;
}

#endif
