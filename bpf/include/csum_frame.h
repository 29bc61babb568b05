/* csum_frame.h: ones' complement sums over regions of an XDP frame, xdp.frags fragments included. */
#ifndef L4LAB_CSUM_FRAME_H
#define L4LAB_CSUM_FRAME_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "csum.h"
#include "maps.h"

enum csum_frame_limits {
	CSUM_CHUNK = SCRATCH_LEN, /* bytes copied to lb_scratch and summed per call */
	CSUM_MAX_CHUNKS = 128,    /* 64 KiB: any IP packet */
};

/* Unfolded ones' complement sum of the frame bytes [off, off + len), or -1 when they cannot be read.
 * Chunks start at even distances from off, so the 16-bit word alignment is kept. A global function:
 * the verifier checks its loop once, not once per caller. */
__noinline __s64 csum_region(struct xdp_md *ctx, __u32 off, __u32 len)
{
	__u32 full = len / CSUM_CHUNK;
	struct scratch_page *buf = bpf_map_lookup_elem(&lb_scratch, &lb_zero_key);
	__u64 rest = len % CSUM_CHUNK, padded;
	__s64 sum = 0;

	if (!buf)
		return -1;
	for (__u32 i = 0; i < CSUM_MAX_CHUNKS; i++) {
		if (i >= full)
			break;
		if (bpf_xdp_load_bytes(ctx, off + i * CSUM_CHUNK, buf->bytes, CSUM_CHUNK))
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)buf->bytes, CSUM_CHUNK, (__wsum)sum);
		if (sum < 0)
			return -1;
	}
	if (full > CSUM_MAX_CHUNKS)
		return -1;
	if (!rest)
		return sum;
	/* rest is 1..511; restate it opaquely to clang so that the verifier sees the bound on the
	 * very register passed to the helpers. */
	asm volatile("%[r] += -1; %[r] &= 0x1ff; %[r] += 1" : [r] "+r"(rest));
	padded = (rest + 3) & 0x3fc;
	if (rest & 3)
		((__u32 *)buf->bytes)[(rest >> 2) & (CSUM_CHUNK / 4 - 1)] = 0;
	if (bpf_xdp_load_bytes(ctx, off + full * CSUM_CHUNK, buf->bytes, rest))
		return -1;
	asm volatile("%[p] &= 0x3fc" : [p] "+r"(padded));
	if (padded > CSUM_CHUNK)
		return -1;
	return bpf_csum_diff(NULL, 0, (__be32 *)buf->bytes, padded, (__wsum)sum);
}

#endif
