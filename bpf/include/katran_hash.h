/* katran_hash.h: Katran's flow hash, for VIPs whose ring is Katran's (LB_VIP_HASH_KATRAN): mixed fleets. */
#ifndef L4LAB_KATRAN_HASH_H
#define L4LAB_KATRAN_HASH_H

#include "maps.h"
#include "hash.h"

/* The facts (which fields, which seeds, the byte order of each word) are in balancer/katran_hash.py,
 * the model the controller and the tests use. The hash is the Linux kernel's jhash (Bob Jenkins'
 * lookup3), as Katran's datapath computes it. */
enum jhash_constants {
	JHASH_INITVAL = 0xdeadbeef,
};

/* One step of lookup3's final mix: x ^= y, x -= y <<< r. */
static __always_inline __u32 jhash_fold(__u32 x, __u32 y, __u32 r)
{
	return (x ^ y) - hash_rotl(y, r);
}

static __always_inline __u32 jhash_final(__u32 a, __u32 b, __u32 c)
{
	c = jhash_fold(c, b, 14);
	a = jhash_fold(a, c, 11);
	b = jhash_fold(b, a, 25);
	c = jhash_fold(c, b, 16);
	a = jhash_fold(a, c, 4);
	b = jhash_fold(b, a, 14);
	return jhash_fold(c, b, 24);
}

/* One step of lookup3's mix of (a, b, c): x -= z, x ^= z <<< r, z += y. */
static __always_inline void jhash_step(__u32 *x, __u32 y, __u32 *z, __u32 r)
{
	*x = (*x - *z) ^ hash_rotl(*z, r);
	*z += y;
}

static __always_inline __u32 jhash_2words(__u32 a, __u32 b, __u32 initval)
{
	initval += JHASH_INITVAL + (2 << 2);
	return jhash_final(a + initval, b + initval, initval);
}

/* jhash of an IPv6 flow's 16-byte source address, seeded with MAX_VIPS: words 0-2 mixed, word 3 in
 * the final mix. A global function, as hash_flow6 (hash.h) is: the verifier checks it once. */
__noinline __u32 katran_hash_src6(const struct lb_flow *f)
{
	__u32 a, b, c;

	if (!f)
		return 0; /* never: the caller passes its stack */
	a = b = c = JHASH_INITVAL + 16 + cfg_katran_max_vips;
	a += f->src[0];
	b += f->src[1];
	c += f->src[2];
	jhash_step(&a, b, &c, 4);
	jhash_step(&b, c, &a, 6);
	jhash_step(&c, a, &b, 8);
	jhash_step(&a, b, &c, 16);
	jhash_step(&b, c, &a, 19);
	jhash_step(&c, a, &b, 4);
	return jhash_final(a + f->src[3], b, c);
}

/* Katran's flow hash of a flow key (normalised by flow_key(): no source port for HASH_NO_SPORT, no
 * source address or port for HASH_DPORT_ONLY): the source address and both ports, the destination
 * port zeroed where Katran zeroes it (KATRAN_NO_DPORT), Katran's destination-port-only hash putting it
 * in the source port's place. The destination address and the protocol are not hashed, as in Katran. */
static __always_inline __u32 hash_flow_katran(const struct lb_flow *f, __u32 vip_flags)
{
	__u32 sport = f->sport, dport = f->dport;

	if (vip_flags & LB_VIP_HASH_DPORT_ONLY)
		sport = dport;
	else if (vip_flags & LB_VIP_HASH_KATRAN_NO_DPORT)
		dport = 0;
	return jhash_2words(f->family == LB_AF_INET ? f->src[0] : katran_hash_src6(f), sport | dport << 16,
			    cfg_katran_max_vips * cfg_ring_size);
}

#endif
