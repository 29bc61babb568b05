/* abi.h: the types and constants shared by the datapath and the controller (the BPF/Python contract).
 *
 * Python never copies anything from this file by hand: balancer/abigen.py (make abi) reads the compiled
 * object's BTF and writes balancer/_abi.py. Constants are named enum members (BTF does not record
 * macros); every enum has one exported global below so BTF keeps it. Addresses and ports are in
 * network byte order; an IPv4 address sits in addr[0] with addr[1..3] zero.
 */
#ifndef L4LAB_ABI_H
#define L4LAB_ABI_H

#include <linux/types.h>

/* Defaults for sizes the controller may change at load time (map max_entries, .rodata). */
enum lb_limits {
	LB_DEFAULT_MAX_VIPS = 64,
	LB_DEFAULT_MAX_REALS = 1024,
	LB_DEFAULT_RING_SIZE = 65537,     /* prime; Maglev needs a prime ring */
	LB_DEFAULT_LRU_SIZE = 65536,      /* session entries per possible CPU */
	LB_MAX_CPUS = 128,                /* the session table is sized for at most this many CPUs */
	LB_DEFAULT_GUE_PORT = 6080,
	LB_DEFAULT_UDP_TIMEOUT_S = 30,
	LB_DEFAULT_MTU = 1500,
	LB_VIP_INDEX_SLOTS = 4096,        /* slots of lb_vip_index: lb_vips keys, hashed (a power of 2) */
	LB_VIP_INDEX_HASH = 0x9e3779b1,   /* its multiplier (Fibonacci hashing of the folded key) */
	LB_MAX_SRC_ROUTES = 65536,        /* source prefixes pinned to reals, over every VIP (lb_src_routes) */
	LB_MAX_DECAPS = 64,               /* addresses of this LB that inline decap serves (lb_decaps) */
	LB_MAX_DOWN_REALS = 65536,        /* (VIP, real) pairs down for UDP flow migration (lb_down_reals) */
	LB_DEFAULT_KATRAN_MAX_VIPS = 512, /* Katran's MAX_VIPS: its flow hash's seeds (LB_VIP_HASH_KATRAN) */
};

enum lb_family {
	LB_AF_INET = 4,
	LB_AF_INET6 = 6,
};

/* Encapsulation towards a real, per VIP. The outer family follows the real's family. */
enum lb_encap {
	LB_ENCAP_IPIP = 0, /* 4in4 (proto 4), 6in6 (proto 41), 4in6 (proto 4 in IPv6) */
	LB_ENCAP_GUE1 = 1, /* GUE variant 1: the inner IP packet directly after UDP */
	LB_ENCAP_GUE0 = 2, /* GUE variant 0: a 4-byte GUE header, then the inner IP packet */
};

/* Per-VIP flags (bit set in lb_vip_meta.flags). */
enum lb_vip_flag {
	LB_VIP_HASH_NO_SPORT = 1 << 0,   /* hash on source address only (sticky clients) */
	LB_VIP_HASH_DPORT_ONLY = 1 << 1, /* hash on destination port only */
	LB_VIP_NO_LRU = 1 << 2,          /* bypass the session tables: the ring decides every packet */
	LB_VIP_OUTER_SRC_FLOW = 1 << 3,  /* outer source derived from the flow hash inside the prefix */
	LB_VIP_GUE_CSUM_ZERO = 1 << 4,   /* GUE outer UDP checksum 0 (default: computed), v4 and v6 alike */
	LB_VIP_HASH_KATRAN = 1 << 5,     /* Katran's flow hash and slot (hash % ring size), for Katran's ring */
	LB_VIP_HASH_KATRAN_NO_DPORT = 1 << 6, /* with HASH_KATRAN: zero the destination port (Katran does
	                                       * for a port-0 VIP without F_HASH_SRC_DST_PORT) */
	LB_VIP_SID_QUIC = 1 << 8,        /* server id from the QUIC connection id (route.h) */
	LB_VIP_SID_TCP = 1 << 9,         /* server id from the TCP header option kind 183 (Katran's TPR) */
	LB_VIP_SID_STABLE = 1 << 10,     /* server id from Katran's UDP stable-routing header */
	LB_VIP_SRC_ROUTES = 1 << 11,     /* new flows from a pinned source prefix go to its real (lb_src_routes) */
	LB_VIP_UDP_MIGRATE = 1 << 12,    /* a UDP session to a real down for this VIP is chosen again */
};

/* The flags whose VIPs forward() hands to route_extra() (route.h): off the path of every other VIP. */
enum lb_vip_route_mask {
	LB_VIP_ROUTE_EXTRA = LB_VIP_SID_QUIC | LB_VIP_SID_TCP | LB_VIP_SID_STABLE | LB_VIP_SRC_ROUTES |
			     LB_VIP_UDP_MIGRATE,
};

/* What inline decap does with a tunnel packet addressed to one of the LB's own addresses (lb_decaps). */
enum lb_decap_action {
	LB_DECAP_ACTION_NONE = 0,    /* not a decap address: tunnel packets pass untouched */
	LB_DECAP_ACTION_BALANCE,     /* the inner packet is balanced as if it had arrived bare */
	LB_DECAP_ACTION_LOCAL,       /* the inner packet goes to this host's stack (XDP_PASS) */
	LB_DECAP_ACTION_EGRESS,      /* the inner packet goes back out to the next hop, MACs swapped (XDP_TX) */
};

/* Per-real flags (bit set in lb_real.flags). */
enum lb_real_flag {
	LB_REAL_PRESENT = 1 << 0,
};

/* The final outcome of one packet: exactly one counter per packet processed by the balancer. */
enum lb_reason {
	LB_TX_ENCAP = 0,          /* encapsulated towards a real */
	LB_TX_ICMP_ECHO,          /* echo reply for a VIP */
	LB_TX_ICMP_TOO_BIG,       /* frag-needed / packet-too-big sent back to the client */
	LB_PASS_NOT_IP,           /* not IPv4/IPv6 (ARP, LLDP, ...) */
	LB_PASS_NOT_VIP,          /* IP, but not addressed to a configured VIP */
	LB_PASS_ICMP_NOT_VIP,     /* ICMP/ICMPv6 not about a VIP */
	LB_PASS_FRAG_NOT_VIP,     /* a fragment or IPv4 options on non-VIP traffic */
	LB_DROP_MALFORMED_ETH,    /* truncated Ethernet or VLAN header */
	LB_DROP_MALFORMED_IP,     /* truncated IP header, bad IHL, bad total length */
	LB_DROP_MALFORMED_L4,     /* truncated TCP/UDP/ICMP header */
	LB_DROP_IP_OPTIONS,       /* IPv4 options on VIP traffic */
	LB_DROP_FRAGMENT,         /* a fragment addressed to a VIP */
	LB_DROP_NO_REAL,          /* the VIP has no live real (empty ring) */
	LB_DROP_REAL_MISSING,     /* the ring points at a real id with no address */
	LB_DROP_FAMILY_MISMATCH,  /* IPv6 VIP with an IPv4 real (the controller rejects this too) */
	LB_DROP_TOO_BIG_NO_DF,    /* over the egress MTU without DF: we do not fragment */
	LB_DROP_ENCAP_FAILED,     /* bpf_xdp_adjust_head refused */
	LB_DROP_NO_SETTINGS,      /* the settings array is empty (controller never configured it) */
	LB_DROP_ICMP_UNSUPPORTED, /* ICMP to a VIP that is neither echo nor a parsable error */
	LB_DROP_VLAN_STACKED,     /* more than one 802.1Q tag */
	LB_DROP_ICMP_CHECKSUM,    /* an ICMP echo request to a VIP whose checksum is wrong: no reply */
	LB_PASS_DECAP_LOCAL,      /* inline decap: the inner packet handed to this host's stack */
	LB_TX_DECAP_EGRESS,       /* inline decap: the inner packet sent back out to the next hop */
	LB_DROP_DECAP_MALFORMED,  /* inline decap: the tunnel to our address has no readable inner packet */
	LB_DROP_DECAP_FAILED,     /* inline decap: a helper refused (adjust_head, the tail call) */
	LB_DROP_TTL_EXPIRED,      /* inline decap: the inner packet's TTL / hop limit ran out */
	LB_DROP_NO_EGRESS,        /* two-arm: the egress interface is not in lb_egress (gone, or not written) */
	LB_REASON_COUNT,
};

/* Events counted besides the outcome (several may happen for one packet). */
enum lb_event {
	LB_EV_LRU_HIT = 0,
	LB_EV_LRU_MISS,
	LB_EV_SYN_REHASH,     /* a SYN (without ACK) chose from the ring and created no session */
	LB_EV_RST_NO_ENTRY,   /* an RST did not create a session */
	LB_EV_UDP_EXPIRED,    /* a UDP session older than the timeout was replaced */
	LB_EV_ICMP_STEERED,   /* an ICMP error about a VIP flow sent to the flow's real */
	LB_EV_SID_ROUTED,     /* a server id (QUIC, TCP option, stable routing) chose the real */
	LB_EV_SID_UNKNOWN,    /* a server id no real has: session or ring instead */
	LB_EV_SID_NONE,       /* a packet of a server-id VIP with no usable id (QUIC initial, SYN, id 0) */
	LB_EV_SRC_PINNED,     /* a new flow's source prefix is pinned to a real (lb_src_routes) */
	LB_EV_UDP_MIGRATED,   /* a UDP session pointed at a real down for its VIP: chosen again */
	LB_EV_DECAP_INLINE,   /* a tunnel to one of our addresses stripped, its inner packet balanced */
	LB_EVENT_COUNT,
};

/* Outcomes of the real-server decap program. */
enum lb_decap_reason {
	LB_DECAP_IPIP = 0,       /* IPIP / 6in6 / 4in6 removed */
	LB_DECAP_GUE,            /* GUE (either variant) removed */
	LB_DECAP_PASS_NOT_ENCAP, /* ordinary traffic */
	LB_DECAP_PASS_NOT_LOCAL, /* encapsulated, but the outer destination is not ours */
	LB_DECAP_DROP_MALFORMED, /* truncated or inconsistent outer/inner headers */
	LB_DECAP_DROP_FAILED,    /* the helper that removes the header refused */
	LB_DECAP_PASS_GUE_CONTROL, /* a GUE variant-0 control message (C bit): left to the stack */
	LB_DECAP_REASON_COUNT,
};

struct lb_vip_key {
	__u32 addr[4];
	__u16 port;   /* 0: wildcard VIP matching every port of (addr, proto) */
	__u8 proto;   /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 family;  /* enum lb_family */
};

struct lb_vip_meta {
	__u32 vip_num; /* index into lb_ring (times cfg_ring_size) and lb_vip_stats */
	__u32 flags;   /* enum lb_vip_flag bits */
	__u8 encap;    /* enum lb_encap */
	__u8 pad[3];
};

struct lb_real {
	__u32 addr[4];
	__u8 family;  /* enum lb_family */
	__u8 flags;   /* enum lb_real_flag bits */
	__u16 pad;
};

/* Where a marked health-check probe goes (value of lb_hc_reals, keyed by the probe's mark): the
 * real, and the encapsulation its VIP uses, so the probe reaches the real as client traffic does. */
struct lb_hc_target {
	struct lb_real real;
	__u8 encap;      /* enum lb_encap */
	__u8 pad;
	__u16 gue_port;  /* GUE destination port, network order */
};

/* The 5-tuple of a client flow: what the flow hash reads, and the key of IPv6 sessions (lb_sessions). */
struct lb_flow {
	__u32 src[4];
	__u32 dst[4];
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u16 pad;
};

struct lb_session {
	__u32 real_id;
	__u32 hash;     /* the flow hash the session was made with, for the encap on a hit (0: not known) */
	__u64 atime_ns; /* the coarse monotonic clock at the last packet, for UDP expiry (session.h) */
};

/* The IPv4 session table's shape (lb_sess4_sets, session4.h): sets of 4 ways, two candidate sets per flow. */
enum lb_sess4 {
	LB_SESS4_WAYS = 4,                /* ways per set: a line of 4 keys, then a line of their 4 sessions */
	LB_SESS4_PROTO = 0xff,            /* a key's tag: the protocol in bits 0-7 ... */
	LB_SESS4_CHECK = 0x7fffff00,      /* ... the check in bits 8-30 (0: way empty; all ones: being written) */
	LB_SESS4_OVERFLOW = 0x80000000, /* way 0's tag, bit 31: some flow of this first set lives in its second */
};

/* One way's key in lb_sess4_sets: the IPv4 5-tuple and the tag the writer stores last. */
struct lb_sess4_key {
	__u32 src;
	__u32 dst;
	__u32 ports; /* sport, dport as in struct lb_flow (one word) */
	__u32 tag;   /* enum lb_sess4: proto | check << 8 (| the set's overflow bit in way 0) */
};

/* One 128-byte set of lb_sess4_sets: the keys line, then the sessions line (atime_ns: a TCP way's insert
 * time, a UDP way's last packet). */
struct lb_sess4_set {
	struct lb_sess4_key keys[LB_SESS4_WAYS];
	struct lb_session sess[LB_SESS4_WAYS];
};

struct lb_counter {
	__u64 packets;
	__u64 bytes;
};

/* The per-CPU record of outcomes and events (the one element of lb_counts). Events first: the
 * session events and LB_TX_ENCAP then share the record's first cache line. */
struct lb_counts {
	__u64 events[LB_EVENT_COUNT];               /* occurrences per enum lb_event */
	struct lb_counter reasons[LB_REASON_COUNT]; /* packets and bytes per enum lb_reason */
};

/* Runtime settings, one element of lb_settings; the controller may rewrite it at any time. */
struct lb_settings {
	__u8 nexthop_mac[6]; /* destination MAC of every emitted frame (the router) */
	__u16 gue_port;      /* GUE destination UDP port, network order */
	__u32 src4;          /* outer IPv4 source (fixed), or the prefix base when flow-derived */
	__u32 src4_mask;     /* host bits that the flow hash may set, network order (0: fixed) */
	__u32 src6[4];       /* outer IPv6 source, or prefix base */
	__u32 src6_mask[4];  /* host bits that the flow hash may set */
	__u16 mtu;           /* egress MTU: an encapsulated IP packet larger than this is too big */
	__u16 pad;
	__u32 configured;    /* non-zero once the controller has written this element */
	__u32 cidr_vips;     /* entries in lb_vip_cidrs: 0 spares non-VIP packets its lookups */
	__u32 decaps;        /* entries in lb_decaps: 0 spares non-VIP tunnel packets its lookup */
};

/* Key of lb_vip_cidrs, an LPM trie: a VIP that is a prefix (every address of it served by one ring).
 * prefixlen counts from `port`: 32 (port, proto, family) + the prefix's length. */
struct lb_vip_cidr_key {
	__u32 prefixlen;
	__u16 port;   /* network order; 0: every port */
	__u8 proto;   /* 0 with port 0: the address-only entry, as in lb_vips */
	__u8 family;
	__u32 addr[4];
};

/* Key of lb_src_routes, an LPM trie: a client source prefix pinned to a real for one VIP. prefixlen
 * counts from vip_num: 32 + the prefix's length. Value: the real id. */
struct lb_src_key {
	__u32 prefixlen;
	__u32 vip_num;
	__u32 addr[4];
};

/* Key of lb_down_reals: a real that health checks took down for a VIP (UDP flow migration). */
struct lb_down_key {
	__u32 vip_num;
	__u32 real_id;
};

/* One slot of lb_vip_index, a direct-mapped copy of lb_vips that the controller derives from it.
 * Slot of a key: its five 32-bit words (addr[0..3], then port/proto/family), loaded in host order,
 * XORed together, times LB_VIP_INDEX_HASH, top 12 bits (log2 LB_VIP_INDEX_SLOTS). key.family says
 * what the slot holds: LB_VIP_SLOT_EMPTY, no lb_vips key has this slot (a definite miss);
 * LB_VIP_SLOT_SHARED, two or more keys have it (look in lb_vips); else the one key that has it, with
 * its meta. The meta comes first: the controller writes the key's last word last, so a reader that
 * reads that word first and sees the key never sees a stale meta (see Datapath.sync_vip_index). */
struct lb_vip_slot {
	struct lb_vip_meta meta;
	struct lb_vip_key key;
};

enum lb_vip_slot_state {
	LB_VIP_SLOT_EMPTY = 0,     /* key.family of a slot no key has */
	LB_VIP_SLOT_SHARED = 0xff, /* key.family of a slot two or more keys have: lb_vips decides */
};

/* Special values in struct lb_vip_key (added by the datapath helper). */
enum lb_vip_match {
	LB_MATCH_ANY_PORT = 0,  /* port 0: the wildcard VIP matching every port of (addr, proto) */
	LB_MATCH_ADDR_ONLY = 0, /* proto 0 and port 0: the address-only entry that the controller writes
	                         * once per VIP address (any vip_num); it makes the address a VIP for
	                         * ICMP echo, fragment / IPv4 options drops and malformed-L4 drops */
};

/* Key of the decap program's dc_local map: an address that belongs to this real server. */
struct lb_addr_key {
	__u32 addr[4];
	__u8 family; /* enum lb_family */
	__u8 pad[3];
};

/* The one element of lb_syn_window, per CPU: its SYNs in the current window of the coarse clock (session.h). */
struct lb_syn_window {
	__u64 window; /* the window's index: the clock in ns >> 30 (about a second) */
	__u64 syns;   /* SYNs this CPU saw in it */
};

/* One exported global per enum, so that every enum survives in each object's BTF. */
const volatile enum lb_limits lb_abi_limits __attribute__((used)) = LB_DEFAULT_MAX_VIPS;
const volatile enum lb_family lb_abi_family __attribute__((used)) = LB_AF_INET;
const volatile enum lb_encap lb_abi_encap __attribute__((used)) = LB_ENCAP_IPIP;
const volatile enum lb_vip_flag lb_abi_vip_flag __attribute__((used)) = LB_VIP_HASH_NO_SPORT;
const volatile enum lb_real_flag lb_abi_real_flag __attribute__((used)) = LB_REAL_PRESENT;
const volatile enum lb_reason lb_abi_reason __attribute__((used)) = LB_TX_ENCAP;
const volatile enum lb_event lb_abi_event __attribute__((used)) = LB_EV_LRU_HIT;
const volatile enum lb_decap_reason lb_abi_decap_reason __attribute__((used)) = LB_DECAP_IPIP;
const volatile enum lb_vip_match lb_abi_vip_match __attribute__((used)) = LB_MATCH_ANY_PORT;
const volatile enum lb_vip_slot_state lb_abi_vip_slot_state __attribute__((used)) = LB_VIP_SLOT_EMPTY;
const volatile enum lb_vip_route_mask lb_abi_vip_route_mask __attribute__((used)) = LB_VIP_ROUTE_EXTRA;
const volatile enum lb_decap_action lb_abi_decap_action __attribute__((used)) = LB_DECAP_ACTION_NONE;
const volatile enum lb_sess4 lb_abi_sess4 __attribute__((used)) = LB_SESS4_WAYS;

#endif
