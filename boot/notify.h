/*
 * notify.h — the systemd notification protocol (sd_notify(3)) without libsystemd.
 *
 * Owns: sending "READY=1", "STATUS=...", "EXTEND_TIMEOUT_USEC=...", "WATCHDOG=1",
 * "STOPPING=1" datagrams to $NOTIFY_SOCKET (a path, or an abstract name starting with '@'),
 * and the watchdog interval from $WATCHDOG_USEC. Every call is a no-op returning 0 when the
 * daemon does not run under systemd (no NOTIFY_SOCKET). Must not: block (datagrams are sent
 * with MSG_DONTWAIT).
 */
#ifndef DSV32_NOTIFY_H
#define DSV32_NOTIFY_H

#include <stdint.h>

/* Sends one notification message (e.g. "READY=1"). 0, or -errno. */
int notify_send(const char *msg);
__attribute__((format(printf, 1, 2))) int notify_status(const char *fmt, ...);
int notify_ready(void);
int notify_stopping(void);
int notify_extend_timeout(uint64_t usec);
int notify_watchdog(void);
/* Watchdog interval in microseconds requested by systemd (WATCHDOG_USEC, honouring
 * WATCHDOG_PID), or 0 when no watchdog is configured. */
uint64_t notify_watchdog_usec(void);

#endif
