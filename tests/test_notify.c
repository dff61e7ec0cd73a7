/* test_notify.c — the sd_notify implementation against a real datagram socket. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "boot/notify.h"
#include "tests/test.h"

static int bind_dgram(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof sa.sun_path)
		return -1;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa))
		return -1;
	return fd;
}

static void expect_msg(int fd, const char *want)
{
	char buf[600];
	ssize_t n = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
	REQUIRE(n > 0);
	buf[n] = 0;
	CHECK_EQ_STR(buf, want);
}

TEST(notify, sequence_on_path_socket)
{
	char path[300];
	snprintf(path, sizeof path, "%s/notify.sock", test_tmpdir());
	int fd = bind_dgram(path);
	REQUIRE(fd >= 0);
	setenv("NOTIFY_SOCKET", path, 1);
	CHECK(notify_status("loading %d of %d", 3, 61) == 0);
	CHECK(notify_extend_timeout(30000000) == 0);
	CHECK(notify_ready() == 0);
	CHECK(notify_watchdog() == 0);
	CHECK(notify_stopping() == 0);
	expect_msg(fd, "STATUS=loading 3 of 61");
	expect_msg(fd, "EXTEND_TIMEOUT_USEC=30000000");
	expect_msg(fd, "READY=1");
	expect_msg(fd, "WATCHDOG=1");
	expect_msg(fd, "STOPPING=1");
	close(fd);
}

TEST(notify, abstract_socket_and_absent)
{
	char name[64];
	snprintf(name, sizeof name, "@dsv32-test-notify-%d", (int)getpid());
	int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(name);
	memcpy(sa.sun_path, name, n);
	sa.sun_path[0] = 0;
	REQUIRE(bind(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n)) == 0);
	setenv("NOTIFY_SOCKET", name, 1);
	CHECK(notify_ready() == 0);
	expect_msg(fd, "READY=1");
	close(fd);
	unsetenv("NOTIFY_SOCKET");
	CHECK(notify_ready() == 0); /* not under systemd: a no-op */
}

TEST(notify, watchdog_interval)
{
	unsetenv("WATCHDOG_PID");
	setenv("WATCHDOG_USEC", "20000000", 1);
	CHECK_EQ_INT(notify_watchdog_usec(), 20000000);
	setenv("WATCHDOG_PID", "1", 1); /* another process's watchdog */
	CHECK_EQ_INT(notify_watchdog_usec(), 0);
	char pid[32];
	snprintf(pid, sizeof pid, "%d", (int)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	CHECK_EQ_INT(notify_watchdog_usec(), 20000000);
	unsetenv("WATCHDOG_USEC");
	CHECK_EQ_INT(notify_watchdog_usec(), 0);
}
