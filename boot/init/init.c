/*
 * init.c — dsv32-init: the first process of the appliance image (`make image`), and the
 * table of contents of its life:
 *   1. the kernel's filesystems (proc, sysfs, devtmpfs, tmpfs on /run and /tmp);
 *   2. the configuration: /etc/dsv32/init.conf, then the kernel command line (init_conf.h);
 *   3. kernel modules, the NVIDIA driver's device nodes (nvdev.h), then mounts (a disk with
 *      the checkpoint), each device awaited;
 *   4. dsv32d, supervised as systemd supervises dist/dsv32d.service (svc.h);
 *   5. the ready commands, once, the first time the service is ready; then, as ready-done
 *      says, keep serving, or stop and power off / reboot;
 *   6. shutdown: on SIGTERM, SIGUSR2 or SIGPWR power off, on SIGINT (ctrl-alt-del) or SIGUSR1
 *      reboot: the service stopped (SIGTERM: it drains), every other process ended, sync.
 * Orphans are reaped all along. Run as any other pid (tests, a container) it does 2-6 without
 * mounting anything and, instead of powering off, exits: 0 when every ready command
 * succeeded, 1 when one failed, 2 on a configuration error.
 *
 * Must not: exit while it is PID 1 (the kernel panics), block in anything but poll.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot/init/init_conf.h"
#include "boot/init/nvdev.h"
#include "boot/init/svc.h"
#include "model/fileio.h"

#define LOG(...) fprintf(stderr, "dsv32-init: " __VA_ARGS__)

/* ---- 1. the kernel's filesystems ------------------------------------------------------------ */

static void mount_api(const char *fstype, const char *target, unsigned long flags,
		      const char *data)
{
	mkdir(target, 0755);
	if (mount(fstype, target, fstype, flags, data) && errno != EBUSY)
		LOG("mount %s on %s: %s\n", fstype, target, strerror(errno));
}

static void mount_api_all(void)
{
	mount_api("proc", "/proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	mount_api("sysfs", "/sys", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
	mount_api("devtmpfs", "/dev", MS_NOSUID, "mode=0755");
	mount_api("tmpfs", "/run", MS_NOSUID | MS_NODEV, "mode=0755");
	mount_api("tmpfs", "/tmp", MS_NOSUID | MS_NODEV, "mode=1777");
	if (fcntl(0, F_GETFD) < 0) { /* no console from the kernel: take it now */
		int fd = open("/dev/console", O_RDWR | O_NOCTTY);
		for (int i = 0; fd >= 0 && i < 3; i++)
			if (fd != i)
				dup2(fd, i);
		if (fd > 2)
			close(fd);
	}
}

/* ---- 3. modules and mounts ------------------------------------------------------------------ */

static int load_modules(const struct init_conf *c)
{
	for (int i = 0; i < c->n_modules; i++) {
		int fd = open(c->modules[i], O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			LOG("module %s: cannot open: %s\n", c->modules[i], strerror(errno));
			return -1;
		}
		if (syscall(SYS_finit_module, fd, "", 0) && errno != EEXIST) {
			LOG("module %s: the kernel refused it: %s (its message is above; a module it "
			    "depends on must be loaded before it)\n", c->modules[i], strerror(errno));
			close(fd);
			return -1;
		}
		close(fd);
		LOG("module %s loaded\n", c->modules[i]);
	}
	return 0;
}

/* The NVIDIA driver's nodes under dev, planned from proc (nvidia-devices = on; also the
 * --nvidia-devices option). No driver loaded is not an error here: the service then finds no
 * GPU and says so itself (backend = cuda) or runs on the CPU (auto). */
static int make_nvidia_devices(const char *proc, const char *dev)
{
	struct nvdev_node nodes[NVDEV_MAX];
	struct err e = {{0}};
	int n = nvdev_plan(proc, nodes, NVDEV_MAX, &e);
	if (n < 0 || (n > 0 && nvdev_make(dev, nodes, n, &e))) {
		LOG("nvidia-devices: %s\n", e.msg);
		return -1;
	}
	if (!n)
		LOG("nvidia-devices: no NVIDIA driver in %s/devices: no nodes made (no GPU for the "
		    "service)\n", proc);
	for (int i = 0; i < n; i++)
		LOG("nvidia-devices: %s/%s c %u %u\n", dev, nodes[i].name, nodes[i].major,
		    nodes[i].minor);
	return 0;
}

static int do_mounts(const struct init_conf *c)
{
	for (int i = 0; i < c->n_mounts; i++) {
		const struct init_mount *m = &c->mounts[i];
		/* a device node appears when its driver finds it (devtmpfs): wait for it */
		int64_t until = svc_now_ms() + c->device_timeout_ms;
		struct stat st;
		while (m->source[0] == '/' && stat(m->source, &st) && svc_now_ms() < until)
			usleep(50 * 1000);
		if (m->source[0] == '/' && stat(m->source, &st)) {
			LOG("mount %s on %s: %s did not appear within %.3f s (its driver not loaded?)\n",
			    m->source, m->target, m->source, c->device_timeout_ms / 1e3);
			return -1;
		}
		dir_make(m->target);
		if (mount(m->source, m->target, m->fstype, m->flags, m->data[0] ? m->data : NULL)) {
			LOG("mount %s on %s (%s): %s\n", m->source, m->target, m->fstype,
			    strerror(errno));
			return -1;
		}
		LOG("mounted %s on %s (%s)\n", m->source, m->target, m->fstype);
	}
	return 0;
}

/* ---- 5. the ready commands ------------------------------------------------------------------ */

struct ready {
	int next;     /* the next command to start; n_ready: all started */
	pid_t pid;    /* the one running, or 0 */
	int failed;   /* how many did not exit 0 */
	int done;     /* all have run */
};

static void ready_start_next(struct ready *r, const struct init_conf *c)
{
	while (r->next < c->n_ready) {
		const char *cmd = c->ready[r->next++];
		LOG("ready command %d: %s\n", r->next, cmd);
		pid_t pid = fork();
		if (pid == 0)
			svc_exec(cmd);
		if (pid > 0) {
			r->pid = pid;
			return;
		}
		LOG("fork: %s\n", strerror(errno));
		r->failed++;
	}
	r->done = 1;
	LOG("ready commands: %d of %d succeeded\n", c->n_ready - r->failed, c->n_ready);
}

/* ---- 6. shutdown ---------------------------------------------------------------------------- */

/* What a signal to PID 1 asks for: SIGINT (ctrl-alt-del) and SIGUSR1 reboot, the rest power off */
static int signal_act(int sig) { return sig == SIGINT || sig == SIGUSR1 ? RB_AUTOBOOT : RB_POWER_OFF; }

/* What ready-done (not serve) asks for */
static int ready_done_act(enum init_ready_done d)
{
	return d == INIT_READY_DONE_REBOOT ? RB_AUTOBOOT : RB_POWER_OFF;
}

/* PID 1's last act: every other process ended, the disks synced, the machine off or rebooted */
static void __attribute__((noreturn)) final_act(int reboot_cmd)
{
	kill(-1, SIGTERM);
	for (int64_t until = svc_now_ms() + 3000; svc_now_ms() < until;) {
		if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD)
			break;
		usleep(20 * 1000);
	}
	kill(-1, SIGKILL);
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	sync();
	LOG("%s\n", reboot_cmd == RB_AUTOBOOT ? "rebooting" : "powering off");
	fflush(NULL);
	for (;;) { /* reboot(2) returns only on failure; PID 1 must not exit */
		reboot(reboot_cmd);
		LOG("reboot(2): %s\n", strerror(errno));
		sleep(60);
	}
}

/* ---- 2, 4, 5, 6: the loop ------------------------------------------------------------------- */

struct init {
	int pid1;
	const char *conf_path, *cmdline_path, *notify_path;
	int conf_must_exist; /* given with --conf */
	struct init_conf conf;
	struct svc svc;
	struct ready ready;
	int shutting_down, reboot_cmd;
};

static int load_conf(struct init *in)
{
	struct err e = {{0}};
	struct stat st;
	init_conf_defaults(&in->conf);
	if ((in->conf_must_exist || !stat(in->conf_path, &st)) &&
	    init_conf_load_file(&in->conf, in->conf_path, &e))
		goto bad;
	if (in->cmdline_path) {
		char *text = file_read_stream(in->cmdline_path, 65536, &e);
		if (!text)
			goto bad;
		int r = init_conf_load_cmdline(&in->conf, text, &e);
		free(text);
		if (r)
			goto bad;
	}
	init_conf_print(&in->conf, stderr, "dsv32-init: ");
	return 0;
bad:
	LOG("configuration error: %s\n", e.msg);
	return -1;
}

static void begin_shutdown(struct init *in, int reboot_cmd)
{
	if (in->shutting_down)
		return;
	in->shutting_down = 1;
	in->reboot_cmd = reboot_cmd;
	if (in->ready.pid > 0)
		kill(in->ready.pid, SIGTERM);
	svc_stop(&in->svc, svc_now_ms());
}

/* The next ready command; after the last, what ready-done says */
static void ready_step(struct init *in)
{
	ready_start_next(&in->ready, &in->conf);
	if (in->ready.done && in->conf.ready_done != INIT_READY_DONE_SERVE)
		begin_shutdown(in, ready_done_act(in->conf.ready_done));
}

static void on_signal(struct init *in, int sig)
{
	if (sig == SIGCHLD) {
		int status;
		pid_t pid;
		while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
			if (pid == in->svc.pid) {
				svc_on_exit(&in->svc, status, svc_now_ms());
			} else if (pid == in->ready.pid) {
				int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
				LOG("ready command %d %s (status 0x%x)\n", in->ready.next,
				    ok ? "succeeded" : "failed", status);
				in->ready.failed += !ok;
				in->ready.pid = 0;
				if (!in->shutting_down)
					ready_step(in);
			} /* else an orphan, reaped */
		}
		return;
	}
	LOG("%s: %s\n", strsignal(sig), signal_act(sig) == RB_AUTOBOOT ? "reboot" : "power off");
	begin_shutdown(in, signal_act(sig));
}

static int run(struct init *in, int sfd)
{
	if (svc_start(&in->svc, svc_now_ms()))
		LOG("fork: %s\n", strerror(errno));
	for (;;) {
		if (in->shutting_down && in->svc.state == SVC_STATE_DOWN) {
			if (in->ready.pid <= 0)
				return in->ready.failed || (in->conf.n_ready && !in->ready.done) ? 1 : 0;
			/* a ready command still running with its server gone (it had SIGTERM) */
			kill(in->ready.pid, SIGKILL);
		}
		int64_t now = svc_now_ms(), dl = svc_deadline(&in->svc);
		int timeout = dl ? (dl > now ? (int)(dl - now < 60000 ? dl - now : 60000) : 0) : -1;
		struct pollfd p[2] = {{sfd, POLLIN, 0}, {svc_fd(&in->svc), POLLIN, 0}};
		if (poll(p, 2, timeout) < 0 && errno != EINTR)
			LOG("poll: %s\n", strerror(errno));
		if (p[0].revents & POLLIN) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) == sizeof si)
				on_signal(in, (int)si.ssi_signo);
		}
		if (p[1].revents & POLLIN)
			svc_on_notify(&in->svc, svc_now_ms());
		svc_on_time(&in->svc, svc_now_ms());
		if (in->svc.became_ready) {
			in->svc.became_ready = 0;
			if (!in->ready.next && !in->ready.done && !in->shutting_down)
				ready_step(in);
		}
	}
}

static int usage(void)
{
	fprintf(stderr, "usage: dsv32-init [--conf FILE] [--cmdline FILE] [--notify PATH] [--check]\n"
			"       dsv32-init --nvidia-devices PROC DEV\n"
			"  As PID 1 (the appliance image's /init): mounts the kernel's filesystems,\n"
			"  reads /etc/dsv32/init.conf and /proc/cmdline, runs dsv32d supervised.\n"
			"  As any other process: the same without the mounts; exits when stopped.\n"
			"  --nvidia-devices: only the NVIDIA driver's device nodes, planned from PROC\n"
			"  (/proc) and made under DEV, then exit (0, or 2 on an error).\n");
	return 2;
}

static int idle_forever(int sfd)
{
	/* PID 1 with no service: keep reaping and honour a power-off or reboot request */
	for (;;) {
		struct signalfd_siginfo si;
		struct pollfd p = {sfd, POLLIN, 0};
		if (poll(&p, 1, -1) < 1 || read(sfd, &si, sizeof si) != sizeof si)
			continue;
		if (si.ssi_signo == SIGCHLD)
			while (waitpid(-1, NULL, WNOHANG) > 0)
				;
		else
			final_act(signal_act((int)si.ssi_signo));
	}
}

int main(int argc, char **argv)
{
	struct init in = {.pid1 = getpid() == 1, .conf_path = "/etc/dsv32/init.conf",
			  .notify_path = "/run/dsv32-init/notify"};
	int check = 0;
	if (in.pid1)
		in.cmdline_path = "/proc/cmdline";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (i + 1 < argc && !strcmp(argv[i], "--conf"))
			in.conf_path = argv[++i], in.conf_must_exist = 1;
		else if (i + 1 < argc && !strcmp(argv[i], "--cmdline"))
			in.cmdline_path = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--notify"))
			in.notify_path = argv[++i];
		else if (!in.pid1 && i + 2 < argc && !strcmp(argv[i], "--nvidia-devices"))
			return make_nvidia_devices(argv[i + 1], argv[i + 2]) ? 2 : 0;
		else if (!in.pid1) /* (the kernel passes PID 1 its own unknown words) */
			return usage();
	}
	setvbuf(stderr, NULL, _IOLBF, 0);
	if (in.pid1) {
		mount_api_all();
		reboot(RB_DISABLE_CAD); /* ctrl-alt-del: SIGINT to us, not an instant reset */
		LOG("dsv32 appliance starting\n");
	}
	sigset_t set;
	sigemptyset(&set);
	int sigs[] = {SIGCHLD, SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGPWR, SIGHUP};
	for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
		sigaddset(&set, sigs[i]);
	sigprocmask(SIG_BLOCK, &set, NULL);
	int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	int bad = load_conf(&in);
	const int conf_bad = bad;
	if (check || (!in.pid1 && bad))
		return bad ? 2 : 0;
	if (!bad && in.pid1 &&
	    (load_modules(&in.conf) ||
	     (in.conf.nvidia_devices && make_nvidia_devices("/proc", "/dev")) ||
	     do_mounts(&in.conf)))
		bad = 1;
	char dir[108];
	snprintf(dir, sizeof dir, "%s", in.notify_path);
	if (strrchr(dir, '/'))
		*strrchr(dir, '/') = 0, dir_make(dir);
	int r = bad ? -1 : svc_open(&in.svc, &in.conf, in.notify_path);
	if (!bad && r)
		LOG("notification socket %s: %s\n", in.notify_path, strerror(-r));
	if (bad || r) {
		if (!in.pid1)
			return 2;
		/* a one-shot image (its configuration read) ends as it would have after its ready
		 * commands (they did not run: their count says so); a serving one, or one whose
		 * configuration is wrong, waits for its operator */
		if (!conf_bad && in.conf.ready_done != INIT_READY_DONE_SERVE && in.conf.n_ready) {
			LOG("the service cannot start; ready commands: 0 of %d succeeded\n",
			    in.conf.n_ready);
			final_act(ready_done_act(in.conf.ready_done));
		}
		LOG("the service is not started; power off with SIGTERM, reboot with ctrl-alt-del\n");
		idle_forever(sfd);
	}
	int status = run(&in, sfd);
	svc_close(&in.svc);
	if (in.pid1)
		final_act(in.reboot_cmd);
	return status;
}
