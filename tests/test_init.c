/*
 * test_init.c — dsv32-init, the appliance image's first process (boot/init/): its configuration
 * (file, kernel command line, errors that name where and what), its supervision of a service
 * (svc.c against small python3 services that speak the notify protocol: ready, watchdog, start
 * timeout and EXTEND_TIMEOUT_USEC, NotifyAccess=main, a stop that needs SIGKILL, restarts), and
 * the dsv32-init program run as an ordinary process over the real dsv32d on a mini checkpoint
 * (ready commands through the real client, then the stop and the exit status). Booting the
 * image as PID 1 under a kernel is tests/image/boot_test.sh.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/init/init_conf.h"
#include "boot/init/nvdev.h"
#include "boot/init/svc.h"
#include "model/fileio.h"
#include "tests/ckpt_helpers.h"
#include "tests/test.h"

/* ---- configuration -------------------------------------------------------------------------- */

TEST(init, split_words_and_quotes)
{
	char buf[256], *argv[8];
	CHECK_EQ_INT(init_split("  /bin/a  b\t'c d' \"e \\\"f\\\" \\\\\" g'h'i ", buf, sizeof buf,
				argv, 8),
		     5);
	CHECK(!strcmp(argv[0], "/bin/a") && !strcmp(argv[1], "b") && !strcmp(argv[2], "c d"));
	CHECK(!strcmp(argv[3], "e \"f\" \\") && !strcmp(argv[4], "ghi") && argv[5] == NULL);
	CHECK_EQ_INT(init_split("a 'b", buf, sizeof buf, argv, 8), -EINVAL);      /* unclosed */
	CHECK_EQ_INT(init_split("   ", buf, sizeof buf, argv, 8), -EINVAL);       /* no word */
	CHECK_EQ_INT(init_split("1 2 3 4 5 6 7 8", buf, sizeof buf, argv, 8), -EINVAL); /* > 7 */
	CHECK_EQ_INT(init_split("1 2 3 4 5 6 7", buf, sizeof buf, argv, 8), 7);
}

TEST(init, file_then_kernel_command_line)
{
	char path[512];
	snprintf(path, sizeof path, "%s/init.conf", test_tmpdir());
	const char *text = "# comment\n"
			   "exec = /sbin/dsv32d --config /etc/x.conf   # trailing comment\n"
			   "restart_sec = 0.25\n"
			   "watchdog-sec = 10\n"
			   "ready = /bin/dsv32 stats\n"
			   "module = /lib/modules/virtio_blk.ko\n"
			   "nvidia-devices = on\n"
			   "mount = /dev/vda /srv/models ext4 ro,noatime,errors=remount-ro\n";
	REQUIRE(file_write(path, text, strlen(text), NULL) == 0);
	struct init_conf c;
	struct err e = {{0}};
	init_conf_defaults(&c);
	CHECK_EQ_INT(c.restart_ms, 5000);
	CHECK_EQ_INT(c.ready_done, INIT_READY_DONE_SERVE);
	REQUIRE(init_conf_load_file(&c, path, &e) == 0);
	CHECK(!strcmp(c.exec, "/sbin/dsv32d --config /etc/x.conf"));
	CHECK_EQ_INT(c.restart_ms, 250);
	CHECK_EQ_INT(c.watchdog_ms, 10000);
	CHECK_EQ_INT(c.n_ready, 1);
	CHECK_EQ_INT(c.n_modules, 1);
	CHECK_EQ_INT(c.nvidia_devices, 1);
	REQUIRE(c.n_mounts == 1);
	CHECK(!strcmp(c.mounts[0].source, "/dev/vda") && !strcmp(c.mounts[0].target, "/srv/models"));
	CHECK(!strcmp(c.mounts[0].fstype, "ext4") && !strcmp(c.mounts[0].data, "errors=remount-ro"));
	CHECK_EQ_INT(c.mounts[0].flags, MS_RDONLY | MS_NOATIME);
	/* the kernel's words are skipped; dsv32. ones override or add */
	const char *cmdline = "BOOT_IMAGE=/vmlinuz console=ttyS0 quiet dsv32.watchdog_sec=2.5 "
			      "dsv32.ready=\"/bin/dsv32 generate --max-tokens 8 'Hi there'\" "
			      "dsv32.ready-done=poweroff panic=-1\n";
	REQUIRE(init_conf_load_cmdline(&c, cmdline, &e) == 0);
	CHECK_EQ_INT(c.watchdog_ms, 2500);
	REQUIRE(c.n_ready == 2);
	CHECK(!strcmp(c.ready[1], "/bin/dsv32 generate --max-tokens 8 'Hi there'"));
	CHECK_EQ_INT(c.ready_done, INIT_READY_DONE_POWEROFF);
}

/* Each bad value: refused, and the message names the origin and the key */
TEST(init, bad_values_name_where_and_key)
{
	static const struct {
		const char *key, *value, *says;
	} bad[] = {
		{"restart-sec", "-1", "restart-sec: \"-1\" is not a number of seconds"},
		{"restart-sec", "1.", "restart-sec: \"1.\" is not a number"},
		{"stop-timeout-sec", "5s", "stop-timeout-sec: \"5s\""},
		{"watchdog-sec", "99999999999", "watchdog-sec"},
		{"exec", "dsv32d --x", "exec: \"dsv32d\" is not an absolute path"},
		{"exec", "/sbin/dsv32d 'unclosed", "exec: \"/sbin/dsv32d 'unclosed\" is not a command"},
		{"exec", "", "is not a command"},
		{"ready", "bin/x", "ready: \"bin/x\" is not an absolute path"},
		{"ready-done", "halt", "ready-done: \"halt\" is not serve, poweroff or reboot"},
		{"mount", "/dev/vda /srv", "mount: \"/dev/vda /srv\": expected SOURCE TARGET FSTYPE"},
		{"mount", "/dev/vda srv ext4", "target \"srv\" is not an absolute path"},
		{"module", "virtio.ko", "module: \"virtio.ko\" is not an absolute path"},
		{"runtime-directory", "run", "runtime-directory: \"run\" is not an absolute path"},
		{"nvidia-devices", "yes", "nvidia-devices: \"yes\" is not on or off"},
		{"no-such-key", "1", "unknown key \"no-such-key\""},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct init_conf c;
		struct err e = {{0}};
		init_conf_defaults(&c);
		int r = init_conf_set(&c, bad[i].key, bad[i].value, "f.conf:7", &e);
		CHECK(r < 0);
		if (!strstr(e.msg, "f.conf:7") || !strstr(e.msg, bad[i].says))
			test_fail(__FILE__, __LINE__, "%s = %s: message \"%s\" lacks \"%s\"",
				  bad[i].key, bad[i].value, e.msg, bad[i].says);
	}
	/* a count past its limit */
	struct init_conf c;
	struct err e = {{0}};
	init_conf_defaults(&c);
	for (int i = 0; i < INIT_READY_MAX; i++)
		REQUIRE(init_conf_set(&c, "ready", "/bin/true", "x", &e) == 0);
	CHECK_EQ_INT(init_conf_set(&c, "ready", "/bin/true", "x", &e), -ERANGE);
	CHECK(strstr(e.msg, "more than 8 commands") != NULL);
	/* the file's line and the kernel command line's word */
	char path[512];
	snprintf(path, sizeof path, "%s/bad.conf", test_tmpdir());
	REQUIRE(file_write(path, "exec = /a\n\nwatchdog-sec = soon\n", 31, NULL) == 0);
	init_conf_defaults(&c);
	CHECK(init_conf_load_file(&c, path, &e) < 0);
	CHECK(strstr(e.msg, "bad.conf:3: watchdog-sec: \"soon\"") != NULL);
	CHECK(init_conf_load_cmdline(&c, "quiet dsv32.restart-sec", &e) < 0);
	CHECK(strstr(e.msg, "expected dsv32.KEY=VALUE") != NULL);
	CHECK(init_conf_load_cmdline(&c, "dsv32.ready=\"/bin/x", &e) < 0);
	CHECK(strstr(e.msg, "unclosed quote") != NULL);
}

/* ---- the NVIDIA driver's device nodes ------------------------------------------------------ */

/* PROC/devices, and one information file a GPU (minor < 0: the file without its minor line) */
static void fake_proc(const char *proc, const char *devices, const int *minors, int n)
{
	char path[512];
	REQUIRE(dir_make(proc) == 0);
	snprintf(path, sizeof path, "%s/devices", proc);
	REQUIRE(file_write(path, devices, strlen(devices), NULL) == 0);
	for (int i = 0; i < n; i++) {
		char text[256];
		snprintf(path, sizeof path, "%s/driver/nvidia/gpus/0000:%02x:00.0", proc, 0x18 + i);
		REQUIRE(dir_make(path) == 0);
		int len = minors[i] < 0 ? snprintf(text, sizeof text, "Model: \t\t NVIDIA H200\n")
					: snprintf(text, sizeof text, "Model: \t\t NVIDIA H200\nIRQ: \t\t "
						   "%d\nDevice Minor: \t %d\nBus Location: \t x\n",
						   100 + i, minors[i]);
		strcat(path, "/information");
		REQUIRE(file_write(path, text, (size_t)len, NULL) == 0);
	}
}

TEST(init, nvidia_device_nodes_planned_from_proc)
{
	/* the majors of character devices only; GPUs in the order of their minors */
	const char *devices = "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-nvlink\n"
			      "508 nvidia-uvm\n\nBlock devices:\n  7 loop\n509 nvidia-uvm\n";
	char proc[512], dev[512];
	snprintf(proc, sizeof proc, "%s/proc", test_tmpdir());
	fake_proc(proc, devices, (int[]){2, 0, 1}, 3);
	struct nvdev_node nodes[NVDEV_MAX];
	struct err e = {{0}};
	REQUIRE(nvdev_plan(proc, nodes, NVDEV_MAX, &e) == 6);
	static const struct {
		const char *name;
		unsigned major, minor;
	} want[] = {{"nvidiactl", 195, 255}, {"nvidia-uvm", 508, 0}, {"nvidia-uvm-tools", 508, 1},
		    {"nvidia0", 195, 0},     {"nvidia1", 195, 1},    {"nvidia2", 195, 2}};
	for (int i = 0; i < 6; i++) {
		CHECK_EQ_STR(nodes[i].name, want[i].name);
		CHECK_EQ_INT(nodes[i].major, want[i].major);
		CHECK_EQ_INT(nodes[i].minor, want[i].minor);
	}
	/* no NVIDIA driver: nothing to make; the driver without its uvm module: an error that
	 * says which; a GPU whose information lacks its minor: an error naming the file */
	snprintf(proc, sizeof proc, "%s/proc-none", test_tmpdir());
	fake_proc(proc, "Character devices:\n  1 mem\n\nBlock devices:\n195 nvidia\n", NULL, 0);
	CHECK_EQ_INT(nvdev_plan(proc, nodes, NVDEV_MAX, &e), 0);
	snprintf(proc, sizeof proc, "%s/proc-nouvm", test_tmpdir());
	fake_proc(proc, "Character devices:\n195 nvidia\n", (int[]){0}, 1);
	CHECK_EQ_INT(nvdev_plan(proc, nodes, NVDEV_MAX, &e), -ENODEV);
	CHECK_CONTAINS(e.msg, "nvidia-uvm");
	snprintf(proc, sizeof proc, "%s/proc-nominor", test_tmpdir());
	fake_proc(proc, devices, (int[]){0, -1}, 2);
	CHECK_EQ_INT(nvdev_plan(proc, nodes, NVDEV_MAX, &e), -EINVAL);
	CHECK_CONTAINS(e.msg, "0000:19:00.0/information");
	CHECK_CONTAINS(e.msg, "Device Minor");
	snprintf(proc, sizeof proc, "%s/proc-absent", test_tmpdir());
	CHECK(nvdev_plan(proc, nodes, NVDEV_MAX, &e) < 0);
	CHECK_CONTAINS(e.msg, "proc-absent/devices");

	/* the nodes: something else in a node's place is refused by name */
	snprintf(dev, sizeof dev, "%s/dev", test_tmpdir());
	REQUIRE(dir_make(dev) == 0);
	char path[600];
	snprintf(path, sizeof path, "%s/nvidiactl", dev);
	REQUIRE(file_write(path, "x", 1, NULL) == 0);
	CHECK_EQ_INT(nvdev_make(dev, nodes, 6, &e), -EEXIST);
	CHECK_CONTAINS(e.msg, "nvidiactl exists and is not the character device 195:255");
	REQUIRE(unlink(path) == 0);
	/* made where this process may make devices (root); else the refusal names the node */
	int r = nvdev_make(dev, nodes, 6, &e);
	if (r) {
		CHECK_EQ_INT(r, -EPERM);
		CHECK_CONTAINS(e.msg, "mknod");
		CHECK_CONTAINS(e.msg, "nvidiactl");
		return;
	}
	for (int i = 0; i < 6; i++) {
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dev, want[i].name);
		REQUIRE(stat(path, &st) == 0);
		CHECK(S_ISCHR(st.st_mode) && (st.st_mode & 07777) == 0666);
		CHECK(st.st_rdev == makedev(want[i].major, want[i].minor));
	}
	CHECK_EQ_INT(nvdev_make(dev, nodes, 6, &e), 0); /* the same nodes kept */
}

/* ---- the supervisor against small services -------------------------------------------------- */

/* A python3 service: `body` after NOTIFY_SOCKET is in n and send(msg) sends a datagram */
static void py_service(struct init_conf *c, const char *body)
{
	init_conf_defaults(c);
	c->runtime_dir[0] = 0;
	int n = snprintf(c->exec, sizeof c->exec,
			 "/usr/bin/env python3 -c 'import os, socket, signal, sys, time\n"
			 "n = os.environ[\"NOTIFY_SOCKET\"]\n"
			 "def send(m):\n"
			 "    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(m.encode(), n)\n"
			 "%s'",
			 body);
	REQUIRE(n < (int)sizeof c->exec);
}

/* Runs the supervisor's events (its socket, its timers, its child's exit) until done(s) or
 * limit_ms; the result of done */
static int drive(struct svc *s, int (*done)(const struct svc *), int64_t limit_ms)
{
	int64_t end = svc_now_ms() + limit_ms;
	while (!done(s) && svc_now_ms() < end) {
		struct pollfd p = {svc_fd(s), POLLIN, 0};
		poll(&p, 1, 20);
		if (p.revents & POLLIN)
			svc_on_notify(s, svc_now_ms());
		int status;
		if (s->pid > 0 && waitpid(s->pid, &status, WNOHANG) == s->pid)
			svc_on_exit(s, status, svc_now_ms());
		svc_on_time(s, svc_now_ms());
	}
	return done(s);
}

static int is_ready(const struct svc *s) { return s->state == SVC_STATE_READY; }
static int is_down(const struct svc *s) { return s->state == SVC_STATE_DOWN; }
static int restarted(const struct svc *s) { return s->starts >= 2; }
static int is_stopping(const struct svc *s) { return s->state == SVC_STATE_STOPPING; }

static void svc_test_open(struct svc *s, const struct init_conf *c)
{
	char path[512];
	snprintf(path, sizeof path, "%s/notify", test_tmpdir());
	REQUIRE(svc_open(s, c, path) == 0);
	REQUIRE(svc_start(s, svc_now_ms()) == 0);
}

static void svc_test_close(struct svc *s)
{
	if (s->pid > 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
	}
	svc_close(s);
}

TEST(init, ready_status_and_a_clean_stop)
{
	struct init_conf c;
	py_service(&c, "send(\"STATUS=loading\\nEXTEND_TIMEOUT_USEC=1000000\")\n"
		       "send(\"READY=1\\nSTATUS=serving\")\n"
		       "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
		       "while True: time.sleep(0.05); send(\"WATCHDOG=1\")\n");
	c.watchdog_ms = 2000;
	struct svc s;
	svc_test_open(&s, &c);
	REQUIRE(drive(&s, is_ready, 10000));
	CHECK(s.became_ready);
	CHECK_EQ_INT(s.readies, 1);
	/* its pings keep it alive past two watchdog periods */
	usleep(100 * 1000);
	int64_t end = svc_now_ms() + 4500;
	while (svc_now_ms() < end)
		drive(&s, is_stopping, 50);
	CHECK(strcmp(s.status, "serving") == 0);
	CHECK_EQ_INT(s.state, SVC_STATE_READY);
	svc_stop(&s, svc_now_ms());
	REQUIRE(drive(&s, is_down, 5000));
	CHECK(WIFEXITED(s.last_status) && WEXITSTATUS(s.last_status) == 0);
	CHECK_EQ_INT(s.starts, 1); /* a stop asked for: no restart */
	svc_test_close(&s);
}

TEST(init, missed_watchdog_is_aborted_and_restarted)
{
	struct init_conf c;
	py_service(&c, "send(\"READY=1\")\ntime.sleep(30)\n");
	c.watchdog_ms = 300;
	c.restart_ms = 100;
	struct svc s;
	svc_test_open(&s, &c);
	REQUIRE(drive(&s, is_ready, 10000));
	REQUIRE(drive(&s, restarted, 10000));
	CHECK(WIFSIGNALED(s.last_status) && WTERMSIG(s.last_status) == SIGABRT);
	REQUIRE(drive(&s, is_ready, 10000)); /* the new one is ready in its turn */
	CHECK_EQ_INT(s.readies, 2);
	svc_test_close(&s);
}

TEST(init, start_timeout_and_its_extension)
{
	/* EXTEND_TIMEOUT_USEC carries it past a 2 s start timeout to READY at ~3 s (the start
	 * timeout generous: python's own start may take a while on a busy machine) */
	struct init_conf c;
	py_service(&c, "send(\"EXTEND_TIMEOUT_USEC=4000000\")\ntime.sleep(1.5)\n"
		       "send(\"EXTEND_TIMEOUT_USEC=4000000\")\ntime.sleep(1.5)\n"
		       "send(\"READY=1\")\ntime.sleep(30)\n");
	c.start_timeout_ms = 2000;
	int64_t t0 = svc_now_ms();
	struct svc s;
	svc_test_open(&s, &c);
	REQUIRE(drive(&s, is_ready, 20000));
	CHECK(svc_now_ms() - t0 >= 2900); /* past the timeout it was given at the start */
	CHECK_EQ_INT(s.starts, 1);
	svc_test_close(&s);
	/* without it: SIGTERM at the timeout, then started again */
	py_service(&c, "time.sleep(30)\n");
	c.start_timeout_ms = 300;
	c.restart_ms = 100;
	svc_test_open(&s, &c);
	REQUIRE(drive(&s, restarted, 10000));
	CHECK(WIFSIGNALED(s.last_status) && WTERMSIG(s.last_status) == SIGTERM);
	CHECK_EQ_INT(s.readies, 0);
	svc_test_close(&s);
}

TEST(init, only_the_main_process_may_notify)
{
	/* a child of the service says READY=1: ignored (NotifyAccess=main); then the service
	 * itself does */
	struct init_conf c;
	py_service(&c, "pid = os.fork()\n"
		       "if pid == 0: send(\"READY=1\"); os._exit(0)\n"
		       "os.waitpid(pid, 0); time.sleep(0.5); send(\"STATUS=main\\nREADY=1\")\n"
		       "time.sleep(30)\n");
	struct svc s;
	svc_test_open(&s, &c);
	int64_t t0 = svc_now_ms();
	REQUIRE(drive(&s, is_ready, 10000));
	CHECK(svc_now_ms() - t0 >= 400); /* not at the child's word */
	CHECK(strcmp(s.status, "main") == 0);
	svc_test_close(&s);
}

TEST(init, stop_kills_what_ignores_sigterm)
{
	struct init_conf c;
	py_service(&c, "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nsend(\"READY=1\")\n"
		       "time.sleep(30)\n");
	c.stop_timeout_ms = 300;
	struct svc s;
	svc_test_open(&s, &c);
	REQUIRE(drive(&s, is_ready, 10000));
	svc_stop(&s, svc_now_ms());
	REQUIRE(drive(&s, is_down, 10000));
	CHECK(WIFSIGNALED(s.last_status) && WTERMSIG(s.last_status) == SIGKILL);
	CHECK_EQ_INT(s.starts, 1);
	svc_test_close(&s);
}

TEST(init, a_failed_exec_is_restarted)
{
	struct init_conf c;
	init_conf_defaults(&c);
	c.runtime_dir[0] = 0;
	snprintf(c.exec, sizeof c.exec, "/nonexistent/dsv32d --x");
	c.restart_ms = 50;
	struct svc s;
	svc_test_open(&s, &c);
	REQUIRE(drive(&s, restarted, 5000));
	CHECK(WIFEXITED(s.last_status) && WEXITSTATUS(s.last_status) == 127);
	svc_test_close(&s);
}

/* ---- the program over the real daemon ------------------------------------------------------- */

/* test_bin_dir() as an absolute path (commands in the configuration must be) */
static const char *bin(void)
{
	static char path[4096];
	REQUIRE(realpath(test_bin_dir(), path) != NULL);
	return path;
}

/* Runs `dsv32-init ARGS` with its output in TMP/init.log; its exit status, or -1 past limit_s
 * (then killed); *log the output (malloc'd). term_on: SIGTERM once the output shows it. */
static int run_init(const char *args, int limit_s, char **log, const char *term_on)
{
	char logp[512], cmd[4096];
	snprintf(logp, sizeof logp, "%s/init.log", test_tmpdir());
	snprintf(cmd, sizeof cmd, "exec %s/dsv32-init %s >%s 2>&1", test_bin_dir(), args, logp);
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
		_exit(127);
	}
	int status = 0, r = -1;
	for (int64_t t0 = svc_now_ms(); svc_now_ms() - t0 < limit_s * 1000;) {
		if (waitpid(pid, &status, WNOHANG) == pid) {
			r = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
			break;
		}
		char *so_far = term_on ? file_read(logp, NULL, 1 << 22, NULL) : NULL;
		if (so_far && strstr(so_far, term_on)) {
			kill(pid, SIGTERM);
			term_on = NULL;
		}
		free(so_far);
		usleep(20 * 1000);
	}
	if (r < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	*log = file_read(logp, NULL, 1 << 22, NULL);
	return r;
}

/* TMP/init.conf and TMP/d.conf for dsv32d on a mini checkpoint with `ready` lines */
static const char *write_confs(const char *ready_lines, const char *ready_done)
{
	static char path[512];
	const char *model = make_mini("mini", 1, 0);
	char dconf[512], text[20480];
	snprintf(dconf, sizeof dconf, "%s/d.conf", test_tmpdir());
	int n = snprintf(text, sizeof text,
			 "model = %s\nbackend = cpu\nsocket = %s/run/d.sock\nhost-memory-mb = 64\n"
			 "threads = 1\n",
			 model, test_tmpdir());
	REQUIRE(file_write(dconf, text, (size_t)n, NULL) == 0);
	snprintf(path, sizeof path, "%s/init.conf", test_tmpdir());
	n = snprintf(text, sizeof text,
		     "exec = %s/dsv32d --config %s\nruntime-directory = %s/run\nrestart-sec = 0.2\n"
		     "%sready-done = %s\n",
		     bin(), dconf, test_tmpdir(), ready_lines, ready_done);
	REQUIRE(file_write(path, text, (size_t)n, NULL) == 0);
	return path;
}

TEST_T(init, program_serves_runs_ready_commands_and_stops, 120)
{
	char ready[10240], args[1024], *log = NULL;
	snprintf(ready, sizeof ready,
		 "ready = %s/dsv32 generate --socket %s/run/d.sock --max-tokens 4 --temperature 0 "
		 "Hello\nready = %s/dsv32 stats --socket %s/run/d.sock\n",
		 bin(), test_tmpdir(), bin(), test_tmpdir());
	const char *conf = write_confs(ready, "poweroff");
	snprintf(args, sizeof args, "--conf %s --notify %s/notify", conf, test_tmpdir());
	int r = run_init(args, 100, &log, NULL);
	REQUIRE(log);
	if (r != 0)
		fprintf(stderr, "%s", log);
	CHECK_EQ_INT(r, 0);
	CHECK(strstr(log, "dsv32-init: service ready") != NULL);
	CHECK(strstr(log, "completion tokens") != NULL); /* the client's summary line */
	CHECK(strstr(log, "decode_tokens") != NULL);     /* stats */
	CHECK(strstr(log, "ready commands: 2 of 2 succeeded") != NULL);
	CHECK(strstr(log, "service (pid") && strstr(log, "exited with status 0"));
	free(log);
}

TEST_T(init, program_exit_status_says_a_ready_command_failed, 120)
{
	char ready[5120], args[1024], *log = NULL;
	snprintf(ready, sizeof ready, "ready = %s/dsv32 generate --socket %s/nowhere.sock Hi\n",
		 bin(), test_tmpdir());
	const char *conf = write_confs(ready, "poweroff");
	snprintf(args, sizeof args, "--conf %s --notify %s/notify", conf, test_tmpdir());
	int r = run_init(args, 100, &log, NULL);
	REQUIRE(log);
	if (r != 1)
		fprintf(stderr, "%s", log);
	CHECK_EQ_INT(r, 1);
	CHECK(strstr(log, "ready commands: 0 of 1 succeeded") != NULL);
	free(log);
}

TEST_T(init, program_stops_the_service_on_sigterm, 120)
{
	char args[1024], *log = NULL;
	const char *conf = write_confs("", "serve");
	snprintf(args, sizeof args, "--conf %s --notify %s/notify", conf, test_tmpdir());
	/* SIGTERM once it is ready: dsv32d drains and exits 0 */
	int r = run_init(args, 100, &log, "dsv32-init: service ready");
	REQUIRE(log);
	if (r != 0)
		fprintf(stderr, "%s", log);
	CHECK_EQ_INT(r, 0);
	CHECK(strstr(log, "dsv32-init: service ready") != NULL);
	CHECK(strstr(log, "stopping the service") != NULL);
	CHECK(strstr(log, "exited with status 0") != NULL);
	free(log);
}

TEST_T(init, program_ends_a_ready_command_that_outlives_the_stop, 120)
{
	/* a ready command that ignores SIGTERM: killed once the service is down, not waited for */
	char args[1024], *log = NULL;
	const char *conf = write_confs("ready = /usr/bin/env python3 -c 'import signal, time; "
				       "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
				       "print(\"marker-\" + str(41 + 1), flush=True); "
				       "time.sleep(60)'\n",
				       "serve");
	snprintf(args, sizeof args, "--conf %s --notify %s/notify", conf, test_tmpdir());
	int64_t t0 = svc_now_ms();
	int r = run_init(args, 100, &log, "marker-42"); /* (the line, not the configuration's echo) */
	REQUIRE(log);
	if (r != 1 || !strstr(log, "status 0x9)"))
		fprintf(stderr, "%s", log);
	CHECK_EQ_INT(r, 1); /* the ready command did not succeed */
	CHECK(svc_now_ms() - t0 < 50 * 1000);
	CHECK(strstr(log, "ready command 1 failed (status 0x9)") != NULL); /* SIGKILL */
	CHECK(strstr(log, "exited with status 0") != NULL); /* the service's own stop */
	free(log);
}

TEST(init, program_refuses_a_bad_configuration)
{
	char path[512], args[1024], *log = NULL;
	snprintf(path, sizeof path, "%s/init.conf", test_tmpdir());
	REQUIRE(file_write(path, "exec = /sbin/dsv32d\nready-done = later\n", 38, NULL) == 0);
	snprintf(args, sizeof args, "--conf %s --notify %s/notify", path, test_tmpdir());
	CHECK_EQ_INT(run_init(args, 20, &log, NULL), 2);
	REQUIRE(log);
	CHECK(strstr(log, "init.conf:2: ready-done: \"later\"") != NULL);
	free(log);
	/* --check: the same verdict without starting anything */
	snprintf(args, sizeof args, "--check --conf %s", path);
	CHECK_EQ_INT(run_init(args, 20, &log, NULL), 2);
	free(log);
	/* the kernel command line read as /proc/cmdline is, a file of no stated size (a pipe) */
	snprintf(args, sizeof args, "--check --cmdline /dev/stdin < %s/cmdline", test_tmpdir());
	char cl[512];
	snprintf(cl, sizeof cl, "%s/cmdline", test_tmpdir());
	const char *words = "console=ttyS0 dsv32.ready-done=reboot dsv32.restart-sec=0.125\n";
	REQUIRE(file_write(cl, words, strlen(words), NULL) == 0);
	CHECK_EQ_INT(run_init(args, 20, &log, NULL), 0);
	REQUIRE(log);
	CHECK(strstr(log, "ready-done = reboot") && strstr(log, "restart-sec = 0.125"));
	free(log);
	snprintf(args, sizeof args, "--check --conf %s/nonexistent.conf", test_tmpdir());
	CHECK_EQ_INT(run_init(args, 20, &log, NULL), 2);
	REQUIRE(log);
	CHECK(strstr(log, "nonexistent.conf") != NULL);
	free(log);
}
