/*
 * init_conf.c — dsv32-init's keys: defaults, the file, the kernel command line.
 */
#include "boot/init/init_conf.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include "boot/conf.h"

/* enum init_ready_done's values as the key spells them */
static const char *const ready_done_names[] = {"serve", "poweroff", "reboot"};

void init_conf_defaults(struct init_conf *c)
{
	memset(c, 0, sizeof *c);
	snprintf(c->exec, sizeof c->exec, "/sbin/dsv32d --config /etc/dsv32/dsv32d.conf");
	snprintf(c->runtime_dir, sizeof c->runtime_dir, "/run/dsv32");
	/* as dist/dsv32d.service: RestartSec=5s, WatchdogSec=60s, TimeoutStartSec=1h,
	 * TimeoutStopSec=2min */
	c->restart_ms = 5000;
	c->watchdog_ms = 60000;
	c->start_timeout_ms = 3600 * 1000;
	c->stop_timeout_ms = 120 * 1000;
	c->device_timeout_ms = 30 * 1000;
	c->ready_done = INIT_READY_DONE_SERVE;
}

/* "5", "0.25", "90.5" seconds -> milliseconds in [0, 1e9]; -1 if not such a number */
static int64_t parse_seconds(const char *v)
{
	int64_t ms = 0;
	const char *p = v;
	if (*p < '0' || *p > '9')
		return -1;
	for (; *p >= '0' && *p <= '9'; p++)
		if ((ms = ms * 10 + (*p - '0') * 1000) > INT64_C(1000000000))
			return -1;
	if (*p == '.') {
		int64_t unit = 100;
		if (p[1] < '0' || p[1] > '9')
			return -1;
		for (p++; *p >= '0' && *p <= '9'; p++, unit /= 10)
			ms += (*p - '0') * unit; /* digits past the millisecond add nothing */
	}
	return *p ? -1 : ms;
}

static int copy_str(char *dst, size_t size, const char *v, const char *where, const char *key,
		    struct err *e)
{
	if (strlen(v) >= size)
		return err_set(e, -EINVAL, "%s: %s: value longer than %zu bytes", where, key, size - 1);
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* OPTIONS of a mount line into flags and the filesystem's data */
static int mount_options(struct init_mount *m, const char *opts, const char *where,
			 struct err *e)
{
	static const struct {
		const char *name;
		unsigned long set, clear;
	} known[] = {{"ro", MS_RDONLY, 0},	  {"rw", 0, MS_RDONLY}, {"nosuid", MS_NOSUID, 0},
		     {"nodev", MS_NODEV, 0},	  {"noexec", MS_NOEXEC, 0},
		     {"noatime", MS_NOATIME, 0}};
	char buf[256];
	if (copy_str(buf, sizeof buf, opts, where, "mount", e))
		return -EINVAL;
	for (char *save, *o = strtok_r(buf, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		size_t k = 0;
		while (k < sizeof known / sizeof *known && strcmp(known[k].name, o))
			k++;
		if (k < sizeof known / sizeof *known) {
			m->flags = (m->flags | known[k].set) & ~known[k].clear;
			continue;
		}
		size_t n = strlen(m->data);
		if (n + strlen(o) + 2 > sizeof m->data)
			return err_set(e, -EINVAL, "%s: mount: options longer than %zu bytes", where,
				       sizeof m->data - 1);
		snprintf(m->data + n, sizeof m->data - n, "%s%s", n ? "," : "", o);
	}
	return 0;
}

static int set_mount(struct init_conf *c, const char *v, const char *where, struct err *e)
{
	if (c->n_mounts == INIT_MOUNT_MAX)
		return err_set(e, -ERANGE, "%s: mount: more than %d mounts", where, INIT_MOUNT_MAX);
	char buf[INIT_CMD_BYTES], *w[6];
	int n = strlen(v) < sizeof buf ? init_split(v, buf, sizeof buf, w, 6) : -EINVAL;
	if (n < 3 || n > 4)
		return err_set(e, -EINVAL, "%s: mount: \"%s\": expected SOURCE TARGET FSTYPE [OPTIONS]",
			       where, v);
	struct init_mount *m = &c->mounts[c->n_mounts];
	memset(m, 0, sizeof *m);
	if (w[1][0] != '/')
		return err_set(e, -EINVAL, "%s: mount: target \"%s\" is not an absolute path", where,
			       w[1]);
	if (copy_str(m->source, sizeof m->source, w[0], where, "mount", e) ||
	    copy_str(m->target, sizeof m->target, w[1], where, "mount", e) ||
	    copy_str(m->fstype, sizeof m->fstype, w[2], where, "mount", e) ||
	    (n == 4 && mount_options(m, w[3], where, e)))
		return -EINVAL;
	c->n_mounts++;
	return 0;
}

/* A command: at least one word, the first an absolute path (there is no PATH in the image) */
static int check_cmd(const char *v, const char *where, const char *key, struct err *e)
{
	char buf[INIT_CMD_BYTES], *argv[INIT_ARGV_MAX];
	if (strlen(v) >= sizeof buf)
		return err_set(e, -EINVAL, "%s: %s: value longer than %zu bytes", where, key,
			       sizeof buf - 1);
	if (init_split(v, buf, sizeof buf, argv, INIT_ARGV_MAX) < 1)
		return err_set(e, -EINVAL, "%s: %s: \"%s\" is not a command (an unclosed quote, no "
			       "word, or more than %d words)", where, key, v, INIT_ARGV_MAX - 1);
	if (argv[0][0] != '/')
		return err_set(e, -EINVAL, "%s: %s: \"%s\" is not an absolute path", where, key,
			       argv[0]);
	return 0;
}

int init_conf_set(struct init_conf *c, const char *key, const char *value, const char *where,
		  struct err *e)
{
	char k[64];
	size_t n = strlen(key);
	if (n >= sizeof k)
		return err_set(e, -EINVAL, "%s: unknown key \"%s\"", where, key);
	for (size_t i = 0; i <= n; i++)
		k[i] = key[i] == '_' ? '-' : key[i];
	static const struct {
		const char *name;
		size_t off;
	} times[] = {{"restart-sec", offsetof(struct init_conf, restart_ms)},
		     {"watchdog-sec", offsetof(struct init_conf, watchdog_ms)},
		     {"start-timeout-sec", offsetof(struct init_conf, start_timeout_ms)},
		     {"stop-timeout-sec", offsetof(struct init_conf, stop_timeout_ms)},
		     {"device-timeout-sec", offsetof(struct init_conf, device_timeout_ms)}};
	for (size_t i = 0; i < sizeof times / sizeof *times; i++) {
		if (strcmp(k, times[i].name))
			continue;
		int64_t ms = parse_seconds(value);
		if (ms < 0)
			return err_set(e, -EINVAL, "%s: %s: \"%s\" is not a number of seconds (0 to "
				       "1000000)", where, k, value);
		*(int64_t *)((char *)c + times[i].off) = ms;
		return 0;
	}
	if (!strcmp(k, "exec")) {
		if (check_cmd(value, where, k, e))
			return -EINVAL;
		return copy_str(c->exec, sizeof c->exec, value, where, k, e);
	}
	if (!strcmp(k, "runtime-directory")) {
		if (value[0] && value[0] != '/')
			return err_set(e, -EINVAL, "%s: runtime-directory: \"%s\" is not an absolute "
				       "path (or empty: none)", where, value);
		return copy_str(c->runtime_dir, sizeof c->runtime_dir, value, where, k, e);
	}
	if (!strcmp(k, "ready")) {
		if (c->n_ready == INIT_READY_MAX)
			return err_set(e, -ERANGE, "%s: ready: more than %d commands", where,
				       INIT_READY_MAX);
		if (check_cmd(value, where, k, e))
			return -EINVAL;
		return copy_str(c->ready[c->n_ready++], INIT_CMD_BYTES, value, where, k, e);
	}
	if (!strcmp(k, "ready-done")) {
		for (int i = 0; i < 3; i++)
			if (!strcmp(value, ready_done_names[i])) {
				c->ready_done = (enum init_ready_done)i;
				return 0;
			}
		return err_set(e, -EINVAL, "%s: ready-done: \"%s\" is not serve, poweroff or reboot",
			       where, value);
	}
	if (!strcmp(k, "mount"))
		return set_mount(c, value, where, e);
	if (!strcmp(k, "module")) {
		if (c->n_modules == INIT_MODULE_MAX)
			return err_set(e, -ERANGE, "%s: module: more than %d modules", where,
				       INIT_MODULE_MAX);
		if (value[0] != '/')
			return err_set(e, -EINVAL, "%s: module: \"%s\" is not an absolute path", where,
				       value);
		return copy_str(c->modules[c->n_modules++], sizeof c->modules[0], value, where, k, e);
	}
	if (!strcmp(k, "nvidia-devices")) {
		if (strcmp(value, "on") && strcmp(value, "off"))
			return err_set(e, -EINVAL, "%s: nvidia-devices: \"%s\" is not on or off",
				       where, value);
		c->nvidia_devices = !strcmp(value, "on");
		return 0;
	}
	return err_set(e, -EINVAL, "%s: unknown key \"%s\"", where, key);
}

static int init_conf_line(void *ctx, const char *key, const char *value, const char *where,
			  struct err *e)
{
	return init_conf_set(ctx, key, value, where, e);
}

int init_conf_load_file(struct init_conf *c, const char *path, struct err *e)
{
	return conf_file_each(path, init_conf_line, c, e);
}

/* init_split's words; kernel: the kernel's own rule (double quotes only, no escapes) */
static int split_words(const char *cmd, char *buf, size_t bytes, char **argv, int max,
		       int kernel)
{
	if (strlen(cmd) + 1 > bytes || max < 2)
		return -EINVAL;
	int n = 0;
	char *o = buf;
	const char *p = cmd;
	for (;;) {
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (!*p)
			break;
		if (n == max - 1)
			return -EINVAL;
		argv[n++] = o;
		while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
			if (*p == '"' || (*p == '\'' && !kernel)) {
				char q = *p++;
				while (*p && *p != q) {
					if (q == '"' && !kernel && *p == '\\' &&
					    (p[1] == '"' || p[1] == '\\'))
						p++;
					*o++ = *p++;
				}
				if (!*p)
					return -EINVAL; /* unclosed */
				p++;
			} else {
				*o++ = *p++;
			}
		}
		*o++ = 0; /* (the output never outgrows the input: quotes are dropped) */
	}
	argv[n] = NULL;
	return n ? n : -EINVAL;
}

int init_split(const char *cmd, char *buf, size_t bytes, char **argv, int max)
{
	return split_words(cmd, buf, bytes, argv, max, 0);
}

int init_conf_load_cmdline(struct init_conf *c, const char *cmdline, struct err *e)
{
	size_t n = strlen(cmdline);
	char *buf = malloc(n + 1), *words[512];
	if (!buf)
		return err_set(e, -ENOMEM, "kernel command line: out of memory");
	int r = 0, nw = split_words(cmdline, buf, n + 1, words, 512, 1);
	if (nw == -EINVAL && strspn(cmdline, " \t\n") != n)
		r = err_set(e, -EINVAL, "kernel command line: an unclosed quote or more than 511 "
			    "words");
	for (int i = 0; i < nw && !r; i++) {
		if (strncmp(words[i], "dsv32.", 6))
			continue;
		char *eq = strchr(words[i], '=');
		if (!eq) {
			r = err_set(e, -EINVAL, "kernel command line: \"%s\": expected dsv32.KEY=VALUE",
				    words[i]);
			break;
		}
		*eq = 0;
		r = init_conf_set(c, words[i] + 6, eq + 1, "kernel command line", e);
	}
	free(buf);
	return r;
}

void init_conf_print(const struct init_conf *c, FILE *f, const char *prefix)
{
	fprintf(f, "%sexec = %s\n%sruntime-directory = %s\n", prefix, c->exec, prefix,
		c->runtime_dir);
	fprintf(f, "%srestart-sec = %.3f\n%swatchdog-sec = %.3f\n%sstart-timeout-sec = %.3f\n"
		   "%sstop-timeout-sec = %.3f\n%sdevice-timeout-sec = %.3f\n",
		prefix, c->restart_ms / 1e3, prefix, c->watchdog_ms / 1e3, prefix,
		c->start_timeout_ms / 1e3, prefix, c->stop_timeout_ms / 1e3, prefix,
		c->device_timeout_ms / 1e3);
	for (int i = 0; i < c->n_modules; i++)
		fprintf(f, "%smodule = %s\n", prefix, c->modules[i]);
	fprintf(f, "%snvidia-devices = %s\n", prefix, c->nvidia_devices ? "on" : "off");
	for (int i = 0; i < c->n_mounts; i++)
		fprintf(f, "%smount = %s %s %s flags 0x%lx%s%s\n", prefix, c->mounts[i].source,
			c->mounts[i].target, c->mounts[i].fstype, c->mounts[i].flags,
			c->mounts[i].data[0] ? " " : "", c->mounts[i].data);
	for (int i = 0; i < c->n_ready; i++)
		fprintf(f, "%sready = %s\n", prefix, c->ready[i]);
	fprintf(f, "%sready-done = %s\n", prefix, ready_done_names[c->ready_done]);
}
