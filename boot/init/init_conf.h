/*
 * init_conf.h — dsv32-init's configuration: built-in defaults, then /etc/dsv32/init.conf (the
 * format of dsv32d.conf: `key = value` lines, `#` comments; boot/conf.h), then the kernel
 * command line's `dsv32.KEY=VALUE` words (/proc/cmdline; a value with spaces in double quotes:
 * dsv32.ready="/bin/dsv32 stats"), later ones winning; `ready` adds a command each time.
 *
 * Owns: the keys, their parsing and their check, and splitting a command line into argv
 * (words apart by blanks; '...' literal, "..." with \" and \\). Must not: run anything.
 */
#ifndef DSV32_INIT_CONF_H
#define DSV32_INIT_CONF_H

#include <stdint.h>
#include <stdio.h>

#include "model/err.h"

#define INIT_READY_MAX 8  /* ready commands */
#define INIT_MOUNT_MAX 8  /* mounts */
#define INIT_MODULE_MAX 16 /* kernel modules */
#define INIT_CMD_BYTES 1024
#define INIT_ARGV_MAX 64 /* words of one command */

/* What dsv32-init does once every ready command has run */
enum init_ready_done {
	INIT_READY_DONE_SERVE,    /* keep serving (the default) */
	INIT_READY_DONE_POWEROFF, /* stop the service and power off (a one-shot image: a check, a batch job) */
	INIT_READY_DONE_REBOOT,
};

/* mount = SOURCE TARGET FSTYPE [OPTIONS]: OPTIONS comma-separated, the flags (ro, rw, nosuid,
 * nodev, noexec, noatime) taken out, the rest given to the filesystem */
struct init_mount {
	char source[256], target[256], fstype[32], data[256];
	unsigned long flags; /* MS_* */
};

struct init_conf {
	char exec[INIT_CMD_BYTES];   /* the service: dsv32d and its flags */
	char runtime_dir[256];       /* created (0755) before each start, as RuntimeDirectory= */
	int64_t restart_ms;          /* after the service ends other than by a stop: wait, start again */
	int64_t watchdog_ms;         /* 0: none; else WATCHDOG=1 at least this often once ready */
	int64_t start_timeout_ms;    /* READY=1 within this (EXTEND_TIMEOUT_USEC extends it); 0: none */
	int64_t stop_timeout_ms;     /* after SIGTERM (or the watchdog's SIGABRT), before SIGKILL */
	int64_t device_timeout_ms;   /* how long a mount waits for its device to appear */
	int n_ready;
	char ready[INIT_READY_MAX][INIT_CMD_BYTES]; /* run in order the first time the service is ready */
	enum init_ready_done ready_done;
	int n_mounts;
	struct init_mount mounts[INIT_MOUNT_MAX]; /* mounted in order before the service starts */
	int n_modules;
	char modules[INIT_MODULE_MAX][256]; /* kernel modules (.ko) loaded before the mounts */
	int nvidia_devices; /* after the modules, the NVIDIA driver's device nodes (nvdev.h) */
};

void init_conf_defaults(struct init_conf *c);
/* One key; `where` names the origin in messages ("file:line", "kernel command line"). 0, or
 * -EINVAL / -ERANGE with e naming where, the key and what was wrong. */
int init_conf_set(struct init_conf *c, const char *key, const char *value, const char *where,
		  struct err *e);
int init_conf_load_file(struct init_conf *c, const char *path, struct err *e);
/* The `dsv32.` words of a kernel command line (the text of /proc/cmdline); other words are the
 * kernel's and are skipped. */
int init_conf_load_cmdline(struct init_conf *c, const char *cmdline, struct err *e);
/* Splits cmd into at most max - 1 words (argv[n] = NULL) inside buf (bytes >= strlen(cmd) + 1).
 * The count, or -EINVAL (an unclosed quote, too many words, no word at all). */
int init_split(const char *cmd, char *buf, size_t bytes, char **argv, int max);
void init_conf_print(const struct init_conf *c, FILE *f, const char *prefix);

#endif
