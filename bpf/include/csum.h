/* csum.h: Internet checksums: folding, the IPv4 header, incremental updates, and sums over packet regions. */
#ifndef L4LAB_CSUM_H
#define L4LAB_CSUM_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

enum csum_limits {
	CSUM_CHUNK = 512,      /* bpf_csum_diff sums at most 512 bytes per call */
	CSUM_MAX_CHUNKS = 128, /* 64 KiB: any IP packet */
};

struct csum_scratch {
	__u8 bytes[CSUM_CHUNK];
};

/* One page of per-CPU scratch: packet bytes are copied here (bpf_xdp_load_bytes works across
 * xdp.frags fragments) and summed with bpf_csum_diff. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct csum_scratch);
} lb_scratch SEC(".maps");

static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

/* Ones' complement sum of `words` 16-bit words at p (no folding). */
static __always_inline __u64 csum_words(const void *p, int words)
{
	const __u16 *w = p;
	__u64 sum = 0;

	for (int i = 0; i < words; i++)
		sum += w[i];
	return sum;
}

/* The checksum of a 20-byte IPv4 header whose check field is zero. */
static __always_inline __u16 csum_ipv4_header(const void *hdr)
{
	return csum_fold(csum_words(hdr, 10));
}

/* RFC 1624 incremental update of a checksum field when one 16-bit word changes. */
static __always_inline __u16 csum_replace16(__u16 check, __u16 old, __u16 new)
{
	__u64 sum = (__u16)~check;

	sum += (__u16)~old;
	sum += new;
	return csum_fold(sum);
}

/* Unfolded ones' complement sum of the frame bytes [off, off + len), or -1 when they cannot be read.
 * Chunks start at even distances from off, so the 16-bit word alignment is kept. A global function:
 * the verifier checks its loop once, not once per caller. */
__noinline __s64 csum_region(struct xdp_md *ctx, __u32 off, __u32 len)
{
	__u32 zero = 0, full = len / CSUM_CHUNK;
	struct csum_scratch *buf = bpf_map_lookup_elem(&lb_scratch, &zero);
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
