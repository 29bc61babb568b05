/* xdp_exception.bpf.c: counts the kernel's xdp:xdp_exception events (an XDP program returned XDP_ABORTED, or an action its driver could not carry out), per program, action and interface.
 *
 * Attached to the classic tracepoint xdp/xdp_exception; no kernel headers: the tracepoint's record
 * is declared below as /sys/kernel/tracing/events/xdp/xdp_exception/format lays it out (stable
 * since Linux 4.18, when prog_id replaced the program pointer). lab/xdp_exceptions.py reads xe_count.
 */
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "GPL";

/* The tracepoint's record: 8 bytes of common fields, then the event's own. */
struct xdp_exception_record {
	__u16 common_type;
	__u8 common_flags;
	__u8 common_preempt_count;
	__s32 common_pid;
	__s32 prog_id;
	__u32 act;
	__s32 ifindex;
};

struct xe_key {
	__u32 prog_id;
	__u32 act;
	__s32 ifindex;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct xe_key);
	__type(value, __u64);
} xe_count SEC(".maps");

SEC("tracepoint/xdp/xdp_exception")
int count_xdp_exception(struct xdp_exception_record *rec)
{
	struct xe_key key = {.prog_id = (__u32)rec->prog_id, .act = rec->act, .ifindex = rec->ifindex};
	__u64 one = 1, *seen = bpf_map_lookup_elem(&xe_count, &key);

	if (seen)
		__sync_fetch_and_add(seen, 1);
	else if (bpf_map_update_elem(&xe_count, &key, &one, BPF_NOEXIST))
		/* another CPU created it between our lookup and update: add to its entry */
		if ((seen = bpf_map_lookup_elem(&xe_count, &key)))
			__sync_fetch_and_add(seen, 1);
	return 0;
}

/* An XDP program that aborts every frame: the counter's self-test makes the kernel raise the event with it. */
SEC("xdp")
int xdp_abort(struct xdp_md *ctx)
{
	return XDP_ABORTED;
}
