/*
 * futex.h — the two futex calls the rings need, on a 32-bit word of the shared region.
 *
 * The region is a MAP_SHARED mapping of a memfd in two processes, so these are shared
 * (non-private) futexes: the kernel keys them by the inode and offset, not the address.
 * Must not: do anything but the system call.
 */
#ifndef DSV32_IPC_FUTEX_H
#define DSV32_IPC_FUTEX_H

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* From linux/futex.h (not shipped with musl); part of the stable kernel ABI. */
#ifndef FUTEX_WAIT
#define FUTEX_WAIT 0
#define FUTEX_WAKE 1
#endif

/* Wakes every waiter on word. */
static inline void ipc_futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *word == expected, at most timeout_ms (< 0: no limit). Returns 0 when woken
 * (or spuriously), -EAGAIN if *word != expected already, -ETIMEDOUT, -EINTR. */
static inline int ipc_futex_wait(_Atomic uint32_t *word, uint32_t expected, int timeout_ms)
{
	struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
	long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected,
			 timeout_ms < 0 ? NULL : &ts, NULL, 0);
	return r == 0 ? 0 : -errno;
}

#endif
