/* csum.h: Internet checksum arithmetic: folding, word sums, the IPv4 header, incremental updates (no maps, any program type). */
#ifndef L4LAB_CSUM_H
#define L4LAB_CSUM_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

/* csum_fold() of a sum below 2^32: two steps are enough (the first leaves at most 0x1fffe). Each
 * step waits for the one before: measured on the live path, folds were a tenth of a GUE frame's
 * own work (`l4lab bench --profile ip4-gue1`, csum.h). */
static __always_inline __u16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

/* -sum for ones' complement arithmetic, unfolded: a multiple of 0xffff (nothing) above `sum`, less
 * it. Adding it to a sum that is folded later is adding the complement of sum, one fold saved; for
 * sums of at most eight 16-bit words. */
static __always_inline __u64 csum_negate8(__u64 sum)
{
	return 0xffffULL * 8 - sum;
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

/* RFC 1624 (eqn. 3): the unfolded sum after one 16-bit word of the summed data changes. */
static __always_inline __u64 csum_change16(__u64 sum, __u16 old, __u16 new)
{
	return sum + (__u16)~old + new;
}

/* The same for a 32-bit word (two 16-bit words, in packet byte order). */
static __always_inline __u64 csum_change32(__u64 sum, __u32 old, __u32 new)
{
	return csum_change16(csum_change16(sum, old & 0xffff, new & 0xffff), old >> 16, new >> 16);
}

/* RFC 1624 incremental update of a checksum field when one 16-bit word changes. */
static __always_inline __u16 csum_replace16(__u16 check, __u16 old, __u16 new)
{
	return csum_fold(csum_change16((__u16)~check, old, new));
}

#endif
