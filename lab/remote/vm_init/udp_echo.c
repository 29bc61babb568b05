/* udp_echo.c: a UDP echo server for the l4lab VM that answers from the address each datagram was sent to.
 *
 * Usage: udp_echo PORT. One IPv4 and one IPv6 socket (v6-only) bound to the wildcard address;
 * IP_PKTINFO / IPV6_RECVPKTINFO give each datagram's destination, which becomes the reply's
 * source, so a datagram decapsulated towards a VIP on lo is answered from that VIP (DSR).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int open_socket(int family, int port)
{
	int one = 1;
	int fd = socket(family, SOCK_DGRAM, 0);

	if (fd < 0)
		return -1;
	if (family == AF_INET) {
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };

		setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			return -1;
	} else {
		struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_port = htons(port) };

		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			return -1;
	}
	return fd;
}

/* Receive one datagram and send it back with the source set to the address it was sent to. */
static void echo_one(int fd)
{
	char data[65536];
	char ctl[256];
	struct sockaddr_storage peer;
	struct iovec iov = { .iov_base = data, .iov_len = sizeof(data) };
	struct msghdr msg = {
		.msg_name = &peer, .msg_namelen = sizeof(peer),
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = ctl, .msg_controllen = sizeof(ctl),
	};
	ssize_t n = recvmsg(fd, &msg, 0);

	if (n < 0)
		return;
	iov.iov_len = (size_t)n;
	/* The received control message is IP_PKTINFO / IPV6_PKTINFO; sent back, it fixes the source.
	 * Only the destination address is kept: the interface index is cleared so routing decides. */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
			struct in_pktinfo *pi = (struct in_pktinfo *)CMSG_DATA(c);

			pi->ipi_spec_dst = pi->ipi_addr;
			pi->ipi_ifindex = 0;
		} else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
			((struct in6_pktinfo *)CMSG_DATA(c))->ipi6_ifindex = 0;
		}
	}
	sendmsg(fd, &msg, 0);
}

int main(int argc, char **argv)
{
	struct pollfd fds[2];
	int port = argc > 1 ? atoi(argv[1]) : 0;

	if (port <= 0 || port > 65535) {
		fprintf(stderr, "udp_echo: usage: udp_echo PORT (1..65535)\n");
		return 2;
	}
	fds[0].fd = open_socket(AF_INET, port);
	fds[1].fd = open_socket(AF_INET6, port);
	if (fds[0].fd < 0) {
		fprintf(stderr, "udp_echo: cannot bind UDP port %d: %s\n", port, strerror(errno));
		return 1;
	}
	fds[0].events = fds[1].events = POLLIN;
	for (;;) {
		if (poll(fds, fds[1].fd < 0 ? 1 : 2, -1) < 0 && errno != EINTR)
			return 1;
		for (int i = 0; i < 2; i++)
			if (fds[i].fd >= 0 && (fds[i].revents & POLLIN))
				echo_one(fds[i].fd);
	}
}
