/*
 * runner.c — runs every registered test case in a forked child with a timeout.
 *
 * Usage: test_runner [-l] [-j N] [FILTER...]   (a case runs if "suite.name" contains any FILTER)
 * Prints one line per case and ends with exactly one line "N passed, N failed".
 * A case fails if it records a CHECK failure, exits non-zero, crashes or outlives its timeout.
 */
#include "test.h"
#include "model/clock.h"

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static struct test_case *cases;
static int n_failures; /* in the child: CHECK failures of the running case */
static char tmpdir[256];
static char rootdir[4096];
static char bindir[4096];

void test_register(struct test_case *tc)
{
	tc->next = cases;
	cases = tc;
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "    %s:%d: ", file, line);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	n_failures++;
}

void test_abort_case(void)
{
	fflush(NULL);
	_exit(1);
}

const char *test_tmpdir(void) { return tmpdir; }
const char *test_root(void) { return rootdir; }
const char *test_bin_dir(void) { return bindir; }

/* $DSV32_BIN, else the directory this runner was started from (a private build directory's
 * runner must not run the programs of another build). */
static void find_bin_dir(void)
{
	const char *b = getenv("DSV32_BIN");
	if (b && *b) {
		snprintf(bindir, sizeof bindir, "%s", b);
		return;
	}
	ssize_t n = readlink("/proc/self/exe", bindir, sizeof bindir - 1);
	char *slash = n > 0 ? (bindir[n] = 0, strrchr(bindir, '/')) : NULL;
	if (slash)
		*slash = 0;
	else
		strcpy(bindir, "build");
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

static int matches(const struct test_case *tc, int nfilt, char **filt)
{
	if (nfilt == 0)
		return 1;
	char full[256];
	snprintf(full, sizeof full, "%s.%s", tc->suite, tc->name);
	for (int i = 0; i < nfilt; i++)
		if (strstr(full, filt[i]))
			return 1;
	return 0;
}

/* Runs one case in a child; returns 1 if it passed. */
static int run_case(struct test_case *tc)
{
	snprintf(tmpdir, sizeof tmpdir, "/tmp/dsv32-test-%d-%s.%s", (int)getpid(), tc->suite,
		 tc->name);
	mkdir(tmpdir, 0700);
	double t0 = (double)clock_mono_ns() * 1e-6;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 0;
	}
	if (pid == 0) {
		setpgid(0, 0); /* the case and whatever it spawns can be killed as a group */
		alarm((unsigned)tc->timeout_s);
		n_failures = 0;
		tc->fn();
		fflush(NULL);
		_exit(n_failures ? 1 : 0);
	}
	int status = 0;
	/* Enforce the timeout from the parent too: alarm() does not survive a case that blocks
	 * SIGALRM or execs. */
	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			break;
		if (r < 0 && errno != EINTR) {
			perror("waitpid");
			break;
		}
		if ((double)clock_mono_ns() * 1e-6 - t0 > (tc->timeout_s + 5) * 1e3) {
			kill(-pid, SIGKILL);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			status = SIGALRM; /* reported as a timeout below */
			break;
		}
		usleep(1000);
	}
	kill(-pid, SIGKILL); /* reap anything the case left behind */
	double ms = (double)clock_mono_ns() * 1e-6 - t0;
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	if (ok) {
		printf("ok    %s.%s (%.0f ms)\n", tc->suite, tc->name, ms);
	} else if (WIFSIGNALED(status) || status == SIGALRM) {
		int sig = status == SIGALRM ? SIGALRM : WTERMSIG(status);
		printf("FAIL  %s.%s (%s after %.0f ms)\n", tc->suite, tc->name,
		       sig == SIGALRM ? "timeout" : strsignal(sig), ms);
	} else {
		printf("FAIL  %s.%s (%.0f ms)\n", tc->suite, tc->name, ms);
	}
	fflush(stdout);
	return ok;
}

int main(int argc, char **argv)
{
	int list = 0;
	int argi = 1;
	if (argi < argc && !strcmp(argv[argi], "-l")) {
		list = 1;
		argi++;
	}
	if (!getcwd(rootdir, sizeof rootdir))
		strcpy(rootdir, ".");
	find_bin_dir();
	/* Registration runs in constructor order (reverse of link order per file); sort for a
	 * stable, readable order: by suite then name. */
	int n = 0;
	for (struct test_case *c = cases; c; c = c->next)
		n++;
	struct test_case **v = calloc((size_t)n + 1, sizeof *v);
	n = 0;
	for (struct test_case *c = cases; c; c = c->next)
		v[n++] = c;
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0; j--) {
			int c = strcmp(v[j - 1]->suite, v[j]->suite);
			if (c == 0)
				c = strcmp(v[j - 1]->name, v[j]->name);
			if (c <= 0)
				break;
			struct test_case *t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	int passed = 0, failed = 0;
	for (int i = 0; i < n; i++) {
		if (!matches(v[i], argc - argi, argv + argi))
			continue;
		if (list) {
			printf("%s.%s\n", v[i]->suite, v[i]->name);
			continue;
		}
		if (run_case(v[i]))
			passed++;
		else
			failed++;
	}
	free(v);
	if (!list)
		printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
