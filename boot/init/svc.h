/*
 * svc.h — one supervised service, the way systemd runs dist/dsv32d.service: Type=notify
 * (NOTIFY_SOCKET, READY=1, STATUS=, EXTEND_TIMEOUT_USEC=, WATCHDOG=1 with WATCHDOG_USEC and
 * WATCHDOG_PID, NotifyAccess=main), TimeoutStartSec, WatchdogSec (SIGABRT when missed),
 * TimeoutStopSec (SIGTERM, then SIGKILL), Restart=always but after a stop asked for, RestartSec.
 *
 * Owns: the service's process and its notification socket. The caller owns the event loop:
 * it polls svc_fd(), calls svc_on_notify when readable, svc_on_exit for the service's pid
 * from its SIGCHLD handling, and svc_on_time when svc_deadline() passes. Must not: reap
 * processes other than through svc_on_exit (the caller's waitpid sees every child), block.
 */
#ifndef DSV32_SVC_H
#define DSV32_SVC_H

#include <stdint.h>
#include <sys/types.h>

#include "boot/init/init_conf.h"

enum svc_state {
	SVC_STATE_DOWN,     /* not running, no start due (before the first start, after a stop) */
	SVC_STATE_STARTING, /* running, READY=1 not yet sent */
	SVC_STATE_READY,
	SVC_STATE_STOPPING, /* SIGTERM or SIGABRT sent, waiting for it to exit */
	SVC_STATE_WAITING,  /* ended; started again at the deadline */
};

struct svc {
	const struct init_conf *conf;
	enum svc_state state;
	pid_t pid;
	int fd; /* the notification socket (datagrams, SO_PASSCRED) */
	char notify_path[108];
	int64_t deadline_ms;   /* the next timer: start timeout, watchdog, kill, restart; 0: none */
	int64_t watchdog_ms;   /* when the watchdog fires (READY state) */
	int stop_asked;        /* svc_stop was called: no restart */
	int became_ready;      /* set by svc_on_notify on READY=1; the caller clears it */
	int starts, readies;   /* counts, for logs and tests */
	int last_status;       /* the last exit's wait status */
	char status[128];      /* the last STATUS= */
};

/* Opens the notification socket at notify_path (a file path; an existing one is replaced). 0,
 * or -errno. */
int svc_open(struct svc *s, const struct init_conf *c, const char *notify_path);
void svc_close(struct svc *s);
/* Forks and execs conf->exec with NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID set. 0, or
 * -errno (the fork failed; a failed exec is a child exiting with status 127). */
int svc_start(struct svc *s, int64_t now_ms);
/* Reads every pending notification; sets became_ready on READY=1. */
void svc_on_notify(struct svc *s, int64_t now_ms);
/* The service's process ended with wait status `status`. */
void svc_on_exit(struct svc *s, int status, int64_t now_ms);
/* The deadline passed: a start or stop timeout, a missed watchdog, a due restart. */
void svc_on_time(struct svc *s, int64_t now_ms);
/* Stops it for good: SIGTERM, SIGKILL after the stop timeout; no restart. */
void svc_stop(struct svc *s, int64_t now_ms);
int svc_fd(const struct svc *s);
int64_t svc_deadline(const struct svc *s);
const char *svc_state_name(enum svc_state st);
/* In a child just forked by the caller: the signals unblocked (the caller takes its own by a
 * signalfd), cmd split (init_split) and executed; on failure the reason logged, exit 127. */
void svc_exec(const char *cmd) __attribute__((noreturn));
/* A monotonic clock in milliseconds. */
int64_t svc_now_ms(void);

#endif
