/* hash.h: the flow hash that picks the ring slot, the GUE source port, the outer source and the flow label. */
#ifndef L4LAB_HASH_H
#define L4LAB_HASH_H

#include <linux/types.h>

#include "abi.h"

/* MurmurHash3 (x86, 32-bit) block and finalisation steps over the 32-bit words of a flow. */
enum hash_constants {
	HASH_SEED = 0x4c344c42,
};

static __always_inline __u32 hash_rotl(__u32 x, __u32 r)
{
	return (x << r) | (x >> (32 - r));
}

static __always_inline __u32 hash_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = hash_rotl(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = hash_rotl(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 hash_final(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* hash_flow() of an IPv6 flow: a global function with its loop rolled. Inlined or unrolled, clang
 * interleaves the eight mixes and spills them to the stack, and the frames along a call chain
 * (balancer_xdp, forward_steered, this one) share the verifier's 512 bytes. */
__noinline __u32 hash_flow6(const struct lb_flow *f)
{
	__u32 h = HASH_SEED;

	if (!f)
		return 0; /* never: the caller passes its stack */
#pragma clang loop unroll(disable)
	for (int i = 0; i < 8; i++)
		h = hash_mix(h, i < 4 ? f->src[i & 3] : f->dst[i & 3]);
	h = hash_mix(h, ((__u32)f->sport << 16) | f->dport);
	h = hash_mix(h, ((__u32)f->proto << 8) | f->family);
	return hash_final(h ^ (sizeof(*f)));
}

/* Hash of a (possibly normalised) flow key; equal keys give equal hashes on every LB node. */
static __always_inline __u32 hash_flow(const struct lb_flow *f)
{
	__u32 h = HASH_SEED;

	if (f->family != LB_AF_INET)
		return hash_flow6(f);
	/* words 1..3 of IPv4 addresses are zero: four words say it all */
	h = hash_mix(h, f->src[0]);
	h = hash_mix(h, f->dst[0]);
	h = hash_mix(h, ((__u32)f->sport << 16) | f->dport);
	h = hash_mix(h, ((__u32)f->proto << 8) | f->family);
	return hash_final(h ^ 16);
}

#endif
