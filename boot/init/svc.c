/*
 * svc.c — the supervised service: its process, its notifications, its timers.
 */
#include "boot/init/svc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOG(...) fprintf(stderr, "dsv32-init: " __VA_ARGS__)

int64_t svc_now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

const char *svc_state_name(enum svc_state st)
{
	static const char *names[] = {"down", "starting", "ready", "stopping", "waiting"};
	return names[st];
}

int svc_open(struct svc *s, const struct init_conf *c, const char *notify_path)
{
	memset(s, 0, sizeof *s);
	s->conf = c;
	s->fd = -1;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(notify_path) >= sizeof a.sun_path)
		return -ENAMETOOLONG;
	snprintf(s->notify_path, sizeof s->notify_path, "%s", notify_path);
	memcpy(a.sun_path, notify_path, strlen(notify_path) + 1);
	s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->fd < 0)
		return -errno;
	int one = 1; /* the sender's pid with each datagram: only the service's own are taken */
	unlink(notify_path);
	if (setsockopt(s->fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) ||
	    bind(s->fd, (struct sockaddr *)&a, sizeof a)) {
		int r = -errno;
		close(s->fd);
		s->fd = -1;
		return r;
	}
	return 0;
}

void svc_close(struct svc *s)
{
	if (s->fd >= 0) {
		close(s->fd);
		unlink(s->notify_path);
	}
	s->fd = -1;
}

int svc_fd(const struct svc *s) { return s->fd; }
int64_t svc_deadline(const struct svc *s) { return s->deadline_ms; }

void svc_exec(const char *cmd)
{
	char buf[INIT_CMD_BYTES], *argv[INIT_ARGV_MAX];
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (init_split(cmd, buf, sizeof buf, argv, INIT_ARGV_MAX) > 0)
		execv(argv[0], argv);
	LOG("exec %s: %s\n", cmd, strerror(errno));
	_exit(127);
}

/* The child: the environment systemd gives a Type=notify service, then exec */
static void svc_child(const struct svc *s)
{
	char v[32];
	setsid();
	setenv("NOTIFY_SOCKET", s->notify_path, 1);
	if (s->conf->watchdog_ms > 0) {
		snprintf(v, sizeof v, "%lld", (long long)s->conf->watchdog_ms * 1000);
		setenv("WATCHDOG_USEC", v, 1);
		snprintf(v, sizeof v, "%d", (int)getpid());
		setenv("WATCHDOG_PID", v, 1);
	} else {
		unsetenv("WATCHDOG_USEC");
		unsetenv("WATCHDOG_PID");
	}
	svc_exec(s->conf->exec);
}

int svc_start(struct svc *s, int64_t now_ms)
{
	if (s->conf->runtime_dir[0] && mkdir(s->conf->runtime_dir, 0755) && errno != EEXIST)
		LOG("runtime directory %s: %s\n", s->conf->runtime_dir, strerror(errno));
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0)
		svc_child(s);
	s->pid = pid;
	s->starts++;
	s->state = SVC_STATE_STARTING;
	s->status[0] = 0;
	s->deadline_ms = s->conf->start_timeout_ms ? now_ms + s->conf->start_timeout_ms : 0;
	LOG("started %s (pid %d, start %d)\n", s->conf->exec, (int)pid, s->starts);
	return 0;
}

/* SIGTERM (a stop, a start timeout) or SIGABRT (a missed watchdog, as systemd), then SIGKILL
 * after the stop timeout */
static void svc_kill(struct svc *s, int sig, int64_t now_ms)
{
	if (s->pid > 0)
		kill(s->pid, sig);
	s->state = SVC_STATE_STOPPING;
	s->deadline_ms = now_ms + (s->conf->stop_timeout_ms ? s->conf->stop_timeout_ms : 1);
}

/* One notification: newline-separated assignments (sd_notify(3)) */
static void svc_message(struct svc *s, char *msg, int64_t now_ms)
{
	for (char *save, *l = strtok_r(msg, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		if (!strcmp(l, "READY=1") && s->state == SVC_STATE_STARTING) {
			s->state = SVC_STATE_READY;
			s->readies++;
			s->became_ready = 1;
			s->watchdog_ms = s->conf->watchdog_ms ? now_ms + s->conf->watchdog_ms : 0;
			s->deadline_ms = s->watchdog_ms;
			LOG("service ready (pid %d)\n", (int)s->pid);
		} else if (!strcmp(l, "WATCHDOG=1") && s->state == SVC_STATE_READY &&
			   s->conf->watchdog_ms) {
			s->watchdog_ms = s->deadline_ms = now_ms + s->conf->watchdog_ms;
		} else if (!strncmp(l, "EXTEND_TIMEOUT_USEC=", 20) &&
			   s->state == SVC_STATE_STARTING && s->conf->start_timeout_ms) {
			/* systemd: the timeout becomes now + the value if that is later */
			int64_t ext = now_ms + strtoll(l + 20, NULL, 10) / 1000;
			if (ext > s->deadline_ms)
				s->deadline_ms = ext;
		} else if (!strncmp(l, "STATUS=", 7)) {
			snprintf(s->status, sizeof s->status, "%s", l + 7);
			LOG("status: %s\n", s->status);
		} else if (!strcmp(l, "STOPPING=1")) {
			LOG("service stopping (pid %d)\n", (int)s->pid);
		}
	}
}

void svc_on_notify(struct svc *s, int64_t now_ms)
{
	for (;;) {
		char buf[4097];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(struct ucred))];
		} ctl;
		struct iovec iov = {buf, sizeof buf - 1};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = &ctl,
				   .msg_controllen = sizeof ctl};
		ssize_t n = recvmsg(s->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0)
			return; /* EAGAIN: none left */
		buf[n] = 0;
		pid_t from = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
				struct ucred u;
				memcpy(&u, CMSG_DATA(c), sizeof u);
				from = u.pid;
			}
		if (s->pid <= 0)
			continue; /* (a last word of a service already reaped) */
		if (from != s->pid) { /* NotifyAccess=main */
			LOG("notification from pid %d ignored (the service is pid %d)\n", (int)from,
			    (int)s->pid);
			continue;
		}
		svc_message(s, buf, now_ms);
	}
}

static void describe(int status, char *out, size_t n)
{
	if (WIFEXITED(status))
		snprintf(out, n, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(out, n, "killed by signal %d (%s)", WTERMSIG(status),
			 strsignal(WTERMSIG(status)));
	else
		snprintf(out, n, "ended (wait status 0x%x)", status);
}

void svc_on_exit(struct svc *s, int status, int64_t now_ms)
{
	char how[96];
	describe(status, how, sizeof how);
	LOG("service (pid %d) %s\n", (int)s->pid, how);
	s->pid = 0;
	s->last_status = status;
	if (s->stop_asked) {
		s->state = SVC_STATE_DOWN;
		s->deadline_ms = 0;
		return;
	}
	s->state = SVC_STATE_WAITING;
	s->deadline_ms = now_ms + (s->conf->restart_ms ? s->conf->restart_ms : 1);
	LOG("restarting it in %.3f s\n", s->conf->restart_ms / 1e3);
}

void svc_on_time(struct svc *s, int64_t now_ms)
{
	if (!s->deadline_ms || now_ms < s->deadline_ms)
		return;
	switch (s->state) {
	case SVC_STATE_STARTING:
		LOG("service (pid %d) not ready within the start timeout: stopping it\n", (int)s->pid);
		svc_kill(s, SIGTERM, now_ms);
		break;
	case SVC_STATE_READY:
		LOG("service (pid %d) missed its watchdog (%.3f s): SIGABRT\n", (int)s->pid,
		    s->conf->watchdog_ms / 1e3);
		svc_kill(s, SIGABRT, now_ms);
		break;
	case SVC_STATE_STOPPING:
		LOG("service (pid %d) still running after the stop timeout: SIGKILL\n", (int)s->pid);
		if (s->pid > 0)
			kill(s->pid, SIGKILL);
		s->deadline_ms = 0; /* its exit comes through svc_on_exit */
		break;
	case SVC_STATE_WAITING:
		s->deadline_ms = 0;
		if (svc_start(s, now_ms)) {
			LOG("fork: %s; trying again in %.3f s\n", strerror(errno),
			    s->conf->restart_ms / 1e3);
			s->deadline_ms = now_ms + (s->conf->restart_ms ? s->conf->restart_ms : 1000);
		}
		break;
	case SVC_STATE_DOWN:
		s->deadline_ms = 0;
		break;
	}
}

void svc_stop(struct svc *s, int64_t now_ms)
{
	s->stop_asked = 1;
	if (s->pid > 0 && s->state != SVC_STATE_STOPPING) {
		LOG("stopping the service (pid %d): SIGTERM\n", (int)s->pid);
		svc_kill(s, SIGTERM, now_ms);
	} else if (s->pid <= 0) {
		s->state = SVC_STATE_DOWN;
		s->deadline_ms = 0;
	}
}
