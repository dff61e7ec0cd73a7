/* test_unit_file.c — `systemd-analyze verify` accepts dist/dsv32d.service. */
#include <stdlib.h>
#include <unistd.h>

#include "model/fileio.h"
#include "model/json.h"
#include "tests/test.h"

TEST(unit_file, systemd_analyze_verify)
{
	REQUIRE(system("command -v systemd-analyze >/dev/null") == 0); /* CI installs systemd */
	char src[4096], dst[4096], bin[4096], cmd[9000];
	snprintf(src, sizeof src, "%s/dist/dsv32d.service", test_root());
	snprintf(dst, sizeof dst, "%s/dsv32d.service", test_tmpdir());
	const char *b = test_bin_dir();
	if (b[0] == '/')
		snprintf(bin, sizeof bin, "%s/dsv32d", b);
	else
		snprintf(bin, sizeof bin, "%s/%s/dsv32d", test_root(), b);
	REQUIRE(access(bin, X_OK) == 0);
	struct err e;
	size_t n;
	char *unit = file_read(src, &n, 1 << 20, &e);
	REQUIRE(unit);
	/* point ExecStart at the binary just built: verify checks that it is executable */
	char *exec = strstr(unit, "/usr/local/sbin/dsv32d");
	REQUIRE(exec);
	struct sbuf out = {0};
	sbuf_put(&out, unit, (size_t)(exec - unit));
	sbuf_puts(&out, bin);
	sbuf_puts(&out, exec + strlen("/usr/local/sbin/dsv32d"));
	REQUIRE(file_write(dst, out.p, out.len, &e) == 0);
	snprintf(cmd, sizeof cmd, "systemd-analyze verify %s > %s/verify.log 2>&1", dst, test_tmpdir());
	int rc = system(cmd);
	snprintf(cmd, sizeof cmd, "cat %s/verify.log", test_tmpdir());
	if (rc && system(cmd) != 0) /* show why verify failed */
		test_fail(__FILE__, __LINE__, "cannot show %s/verify.log", test_tmpdir());
	CHECK(rc == 0);
	free(unit);
	sbuf_free(&out);
}
