/* gue.h: GUE's header and the constants of the outer headers we write: GUE port, source port range, TTL.
 *
 * GUE (draft-ietf-intarea-gue) runs over UDP to a configured port (LB_DEFAULT_GUE_PORT in abi.h,
 * settings.gue_port / cfg_gue_port at run time). Two forms:
 * - variant 1: the inner IP packet follows the UDP header directly; the first two bits of its
 *   version nibble (4 or 6: binary 01xx) are GUE version 1, so the nibble tells IPv4 from IPv6;
 * - variant 0: a 4-byte header first: version (2 bits, 0), C (1 bit: control message), Hlen
 *   (5 bits: optional fields, in 4-byte words), Proto/ctype (8 bits: 4 IPv4, 41 IPv6), Flags (16 bits).
 * The balancer (encap.h) and the health checker write it, the reals' decap (tunnel.h) reads it.
 * Python reads these constants from balancer/_abi.py (Gue, Outer), generated from BTF.
 */
#ifndef L4LAB_GUE_H
#define L4LAB_GUE_H

#include <linux/types.h>
#include <bpf/bpf_endian.h>

#include "abi.h"

enum lb_gue {
	LB_GUE_HDR_LEN = 4,         /* the variant-0 header */
	LB_GUE_VERSION_SHIFT = 6,   /* version: the top two bits of the first byte */
	LB_GUE_C_BIT = 0x20,        /* variant 0: a control message, not data */
	LB_GUE_HLEN_MASK = 0x1f,    /* variant 0: optional fields, in 4-byte words */
	LB_GUE_SPORT_BASE = 0xc000, /* UDP source ports from 49152, the RFC 6335 dynamic range ... */
	LB_GUE_SPORT_MASK = 0x3fff, /* ... plus 14 bits of the flow hash */
};

/* Fields of every IP header the balancer or the health checker writes afresh. */
enum lb_outer {
	LB_OUTER_TTL = 64, /* TTL / hop limit: the tunnel (or an ICMP answer) is a new hop */
};

/* The outer UDP source port of a GUE packet with this flow hash, network order. */
static __always_inline __be16 gue_sport(__u32 hash)
{
	return bpf_htons(LB_GUE_SPORT_BASE | (hash & LB_GUE_SPORT_MASK));
}

/* Writes the variant-0 header (version 0, C 0, Hlen 0, flags 0) for an inner packet of IP protocol inner_proto (IPPROTO_IPIP / _IPV6). */
static __always_inline void gue_write_v0(void *at, __u8 inner_proto)
{
	__u8 *gh = at;

	gh[0] = 0;
	gh[1] = inner_proto;
	gh[2] = 0;
	gh[3] = 0;
}

const volatile enum lb_gue lb_abi_gue __attribute__((used)) = LB_GUE_HDR_LEN;
const volatile enum lb_outer lb_abi_outer __attribute__((used)) = LB_OUTER_TTL;

#endif
