/* maps.h: the balancer's BPF maps (VIPs, reals, Maglev ring, settings, the session table, counters, scratch). */
#ifndef L4LAB_MAPS_H
#define L4LAB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "abi.h"

/* A BTF-defined map of the usual four attributes (type, entries, key and value types); a map that
 * needs more (flags) is written out. */
#define LB_MAP(_type, _entries, _key, _value) \
	struct { \
		__uint(type, _type); \
		__uint(max_entries, _entries); \
		__type(key, _key); \
		__type(value, _value); \
	}

/* The key of the one-element arrays (lb_settings, lb_counts, lb_scratch), in .rodata: a key on the
 * stack takes a slot of the caller's frame, and the frames of a call chain share the verifier's 512
 * bytes (forward_steered() and its callees in balancer.bpf.c use them all). */
static const __u32 lb_zero_key = 0;

/* Load-time settings; the controller writes them into .rodata before loading. */
const volatile __u32 cfg_ring_size = LB_DEFAULT_RING_SIZE;
/* Two-arm (the controller's datapath.egress): the ifindex of the interface encapsulated frames leave
 * by, 0 for one-arm (they go back out of the interface they came in on); cfg_egress_mac below. Beside
 * cfg_ring_size, which every VIP packet reads: the same cache line. */
const volatile __u32 cfg_egress_ifindex = 0;
const volatile __u64 cfg_udp_timeout_ns = LB_DEFAULT_UDP_TIMEOUT_S * 1000000000ULL;
/* The kernel's tick, for session idle times (session.h): nanoseconds per jiffy (1e9 / HZ) and the
 * jiffies at boot (INITIAL_JIFFIES), which the controller finds (balancer/kclock.py). 0: not known,
 * and the idle clock is bpf_ktime_get_coarse_ns() instead. */
const volatile __u32 cfg_jiffy_ns = 0;
const volatile __u64 cfg_jiffies_at_boot = 0;
/* The Katran fleet's MAX_VIPS, for the seeds of Katran's flow hash (hash.h, LB_VIP_HASH_KATRAN VIPs). */
const volatile __u32 cfg_katran_max_vips = LB_DEFAULT_KATRAN_MAX_VIPS;
/* Two-arm: the egress interface's MAC, the source of what leaves by it: its six bytes first in memory.
 * Load-time, as cfg_egress_ifindex, so the verifier drops the two-arm code from a one-arm program. */
const volatile __u64 cfg_egress_mac = 0;

/* (VIP address, port, proto, family) -> VIP number, flags, encap. Port 0 is the wildcard; proto 0
 * and port 0 is the address-only entry (LB_VIP_ADDR_ONLY) that marks an address as a VIP. */
LB_MAP(BPF_MAP_TYPE_HASH, LB_DEFAULT_MAX_VIPS, struct lb_vip_key, struct lb_vip_meta) lb_vips SEC(".maps");

/* lb_vips, direct-mapped (struct lb_vip_slot): one array element per packet where lb_vips costs a hash
 * of the key and a walk of its bucket; lb_vips is looked up only for a slot that keys share, and an
 * empty slot proves that no VIP has the key (so a non-VIP packet costs two slots at most). The
 * controller writes it as plain memory (BPF_F_MMAPABLE), in an order no reader can misread. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_VIP_INDEX_SLOTS);
	__type(key, __u32);
	__type(value, struct lb_vip_slot);
} lb_vip_index SEC(".maps");

/* real id -> address; id 0 is reserved ("no real"), an entry with family 0 is unused. */
LB_MAP(BPF_MAP_TYPE_ARRAY, LB_DEFAULT_MAX_REALS, __u32, struct lb_real) lb_reals SEC(".maps");

/* Maglev rings, one per VIP number, cfg_ring_size slots each: slot -> real id. Memory-mappable:
 * the controller reads and writes rings as plain memory (aligned 32-bit stores, each atomic), far
 * cheaper than a syscall per batch of slots (architecture.md, decisions). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_DEFAULT_MAX_VIPS * LB_DEFAULT_RING_SIZE);
	__type(key, __u32);
	__type(value, __u32);
} lb_ring SEC(".maps");

LB_MAP(BPF_MAP_TYPE_ARRAY, 1, __u32, struct lb_settings) lb_settings SEC(".maps");

/* A two-arm LB's egress interface (entry 0: its ifindex), the target of bpf_redirect_map. Written by
 * the controller at load: a devmap resolves an ifindex in the namespace of the process that writes it.
 * One per program: the kernel ties a devmap to the first program that uses it, frags or not, and
 * refuses the other (EINVAL once the verifier has passed it). */
LB_MAP(BPF_MAP_TYPE_DEVMAP, 1, __u32, __u32) lb_egress SEC(".maps");
LB_MAP(BPF_MAP_TYPE_DEVMAP, 1, __u32, __u32) lb_egress_frags SEC(".maps");

/* The IPv6 session table (struct lb_flow -> struct lb_session): one LRU hash for every CPU, sized by the
 * controller to lru_size entries per possible CPU. A direct map, so the verifier inlines its lookup
 * (Katran's array of per-CPU LRU hashes calls through the map's operations: the inner map is unknown at
 * load). The common LRU (no BPF_F_NO_COMMON_LRU): its per-CPU free lists refill 128 entries at a time
 * where the per-CPU LRU rotates its lists on every insert. Both measured: architecture.md, decisions. */
LB_MAP(BPF_MAP_TYPE_LRU_HASH, LB_DEFAULT_LRU_SIZE, struct lb_flow, struct lb_session) lb_sessions SEC(".maps");

/* The IPv4 flows' session table (session4.h): 128-byte sets of 4 ways, the controller's session count
 * of ways (a power of two of sets). Memory-mappable: the controller walks and flushes it in place. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, LB_DEFAULT_LRU_SIZE / LB_SESS4_WAYS);
	__type(key, __u32);
	__type(value, struct lb_sess4_set);
} lb_sess4_sets SEC(".maps");
/* Its sets - 1, and 32 - log2(sets) (the second set is the top bits of a product); the controller's. */
const volatile __u32 cfg_sess4_mask = LB_DEFAULT_LRU_SIZE / LB_SESS4_WAYS - 1;
const volatile __u32 cfg_sess4_shift = 18;

LB_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, LB_DEFAULT_MAX_VIPS, __u32, struct lb_counter) lb_vip_stats SEC(".maps");

LB_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, LB_DEFAULT_MAX_REALS, __u32, struct lb_counter) lb_real_stats SEC(".maps");

/* Per CPU, one record that every packet updates once: its reason and the events it met. */
LB_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, 1, __u32, struct lb_counts) lb_counts SEC(".maps");

/* server id -> real id, for VIPs that route by server id (route.h): QUIC connection ids, Katran's TCP
 * option, its UDP stable-routing header. One table for every VIP, as a server id names a host. */
LB_MAP(BPF_MAP_TYPE_HASH, LB_DEFAULT_MAX_REALS, __u32, __u32) lb_server_ids SEC(".maps");

/* VIPs that are prefixes (struct lb_vip_cidr_key -> the VIP's meta), looked up when lb_vips has no
 * entry for a packet's destination and settings.cidr_vips says there are any. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_DEFAULT_MAX_VIPS);
	__type(key, struct lb_vip_cidr_key);
	__type(value, struct lb_vip_meta);
} lb_vip_cidrs SEC(".maps");

/* Client source prefixes pinned to a real, per VIP (struct lb_src_key -> real id; Katran's LPM_SRC). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_MAX_SRC_ROUTES);
	__type(key, struct lb_src_key);
	__type(value, __u32);
} lb_src_routes SEC(".maps");

/* (VIP, real) pairs that health checks took down: a UDP session of such a VIP to such a real is chosen
 * again (LB_VIP_UDP_MIGRATE). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, LB_MAX_DOWN_REALS);
	__type(key, struct lb_down_key);
	__type(value, __u32);
} lb_down_reals SEC(".maps");

/* Addresses of this LB whose IPIP / GUE packets are decapsulated here (struct lb_addr_key -> enum
 * lb_decap_action). */
LB_MAP(BPF_MAP_TYPE_HASH, LB_MAX_DECAPS, struct lb_addr_key, __u32) lb_decaps SEC(".maps");

/* The balancer itself, for a decapsulated packet to be balanced afresh (a tail call; the loader puts
 * the program in slot 0). Two arrays: the kernel ties a program array to one kind of program, with or
 * without multi-buffer frames. */
#define LB_PROG_ARRAY \
	struct { \
		__uint(type, BPF_MAP_TYPE_PROG_ARRAY); \
		__uint(max_entries, 1); \
		__type(key, __u32); \
		__type(value, __u32); \
	}
LB_PROG_ARRAY lb_progs SEC(".maps");
LB_PROG_ARRAY lb_progs_frags SEC(".maps");

enum scratch_limits {
	SCRATCH_LEN = 512, /* bpf_csum_diff sums at most 512 bytes per call */
};

struct scratch_page {
	__u8 bytes[SCRATCH_LEN];
};

/* One page of per-CPU scratch: packet bytes are copied here (bpf_xdp_load_bytes works across
 * xdp.frags fragments) and summed with bpf_csum_diff (csum_frame.h). */
LB_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, 1, __u32, struct scratch_page) lb_scratch SEC(".maps");

#endif
