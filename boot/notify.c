/*
 * notify.c — sd_notify without libsystemd (see notify.h).
 */
#include "boot/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int notify_send(const char *msg)
{
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !path[0])
		return 0;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(path);
	if (n >= sizeof sa.sun_path)
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, n);
	if (path[0] == '@') /* abstract namespace: leading NUL, no terminator */
		sa.sun_path[0] = 0;
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] != '@'));
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ssize_t r = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, len);
	int err = r < 0 ? -errno : 0;
	close(fd);
	return err;
}

int notify_status(const char *fmt, ...)
{
	char buf[512] = "STATUS=";
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf + 7, sizeof buf - 7, fmt, ap);
	va_end(ap);
	return notify_send(buf);
}

int notify_ready(void) { return notify_send("READY=1"); }
int notify_stopping(void) { return notify_send("STOPPING=1"); }
int notify_watchdog(void) { return notify_send("WATCHDOG=1"); }

int notify_extend_timeout(uint64_t usec)
{
	char buf[64];
	snprintf(buf, sizeof buf, "EXTEND_TIMEOUT_USEC=%llu", (unsigned long long)usec);
	return notify_send(buf);
}

uint64_t notify_watchdog_usec(void)
{
	const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	if (!us)
		return 0;
	if (pid && strtol(pid, NULL, 10) != (long)getpid())
		return 0; /* meant for another process */
	char *end;
	unsigned long long v = strtoull(us, &end, 10);
	return *end ? 0 : (uint64_t)v;
}
