/*
 * test_mkimage.c — tools/mkimage: the appliance image's cpio (newc) archive, packed from a tree
 * and listed back; reproducible bytes; device nodes; bad input refused with a reason. (The
 * kernel unpacking a real image is tests/image/boot_test.sh.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/fileio.h"
#include "tests/test.h"

/* `mkimage ARGS` in TMP with its output in TMP/mkimage.log; exit status, *out the output */
static int mkimage(const char *args, char **out)
{
	char cmd[8192], bin[4096];
	REQUIRE(realpath(test_bin_dir(), bin) != NULL);
	snprintf(cmd, sizeof cmd, "cd %s && %s/mkimage %s > mkimage.log 2>&1", test_tmpdir(), bin,
		 args);
	int st = system(cmd);
	char path[512];
	snprintf(path, sizeof path, "%s/mkimage.log", test_tmpdir());
	if (out)
		*out = file_read(path, NULL, 1 << 20, NULL);
	return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

static void put(const char *rel, const char *text)
{
	char path[512];
	snprintf(path, sizeof path, "%s/%s", test_tmpdir(), rel);
	REQUIRE(file_write(path, text, strlen(text), NULL) == 0);
}

static void make_tree(void)
{
	char p[512];
	snprintf(p, sizeof p, "%s/root", test_tmpdir());
	REQUIRE(mkdir(p, 0755) == 0);
	snprintf(p, sizeof p, "%s/root/dev", test_tmpdir());
	REQUIRE(mkdir(p, 0755) == 0);
	snprintf(p, sizeof p, "%s/root/sbin", test_tmpdir());
	REQUIRE(mkdir(p, 0750) == 0);
	put("root/sbin/b", "12345"); /* sizes that need padding: 5, 0, 3 */
	put("root/a", "");
	put("root/sbin/a.conf", "x=1");
	snprintf(p, sizeof p, "%s/root/sbin/b", test_tmpdir());
	REQUIRE(chmod(p, 0755) == 0);
	snprintf(p, sizeof p, "%s/root/init", test_tmpdir());
	REQUIRE(symlink("sbin/b", p) == 0);
}

TEST(mkimage, packs_a_tree_and_lists_it_back)
{
	make_tree();
	char *out = NULL;
	REQUIRE(mkimage("--out img.cpio --tree root --nod /dev/console:c:5:1:0600", &out) == 0);
	CHECK(out && strstr(out, "img.cpio: 8 entries"));
	free(out);
	REQUIRE(mkimage("--list img.cpio", &out) == 0);
	REQUIRE(out);
	const char *want = "100644          0 a\n"
			   "040755          0 dev\n"
			   "120777          6 init\n"
			   "040750          0 sbin\n"
			   "100644          3 sbin/a.conf\n"
			   "100755          5 sbin/b\n"
			   "020600          0 dev/console (5, 1)\n";
	if (strcmp(out, want))
		test_fail(__FILE__, __LINE__, "listing:\n%s\nwanted:\n%s", out, want);
	free(out);
	/* the bytes: a newc header first, the file's data where the format puts it, a 512-byte
	 * multiple in all */
	char path[512];
	size_t n;
	snprintf(path, sizeof path, "%s/img.cpio", test_tmpdir());
	char *img = file_read(path, &n, 1 << 20, NULL);
	REQUIRE(img);
	CHECK(n % 512 == 0);
	CHECK(memcmp(img, "070701", 6) == 0);
	CHECK(memmem(img, n, "12345", 5) != NULL);
	CHECK(memmem(img, n, "TRAILER!!!", 10) != NULL);
	free(img);
}

TEST(mkimage, the_same_tree_gives_the_same_bytes)
{
	make_tree();
	REQUIRE(mkimage("--out 1.cpio --tree root", NULL) == 0);
	/* touched files and another order of creation change nothing */
	char p[512];
	snprintf(p, sizeof p, "%s/root/a", test_tmpdir());
	REQUIRE(unlink(p) == 0);
	sleep(1);
	put("root/a", "");
	REQUIRE(mkimage("--out 2.cpio --tree root", NULL) == 0);
	REQUIRE(mkimage("--out 3.cpio --tree root", NULL) == 0);
	char a[512], b[512], c[512];
	size_t na, nb, nc;
	snprintf(a, sizeof a, "%s/1.cpio", test_tmpdir());
	snprintf(b, sizeof b, "%s/2.cpio", test_tmpdir());
	snprintf(c, sizeof c, "%s/3.cpio", test_tmpdir());
	char *x = file_read(a, &na, 1 << 20, NULL), *y = file_read(b, &nb, 1 << 20, NULL);
	char *z = file_read(c, &nc, 1 << 20, NULL);
	REQUIRE(x && y && z);
	CHECK(na == nb && !memcmp(x, y, na));
	CHECK(nb == nc && !memcmp(y, z, nb));
	free(x), free(y), free(z);
}

TEST(mkimage, bad_input_is_refused_with_a_reason)
{
	make_tree();
	char *out = NULL;
	CHECK_EQ_INT(mkimage("--out x.cpio --tree root --nod /etc/console:c:5:1:0600", &out), 1);
	CHECK(out && strstr(out, "its directory is not in the tree"));
	free(out);
	CHECK_EQ_INT(mkimage("--out x.cpio --tree root --nod /dev/console:q:5:1:0600", &out), 1);
	CHECK(out && strstr(out, "expected PATH:c|b:MAJOR:MINOR:MODE"));
	free(out);
	CHECK_EQ_INT(mkimage("--out x.cpio --tree nowhere", &out), 1);
	CHECK(out && strstr(out, "nowhere"));
	free(out);
	char p[512];
	snprintf(p, sizeof p, "%s/x.cpio", test_tmpdir());
	CHECK(access(p, F_OK) != 0); /* nothing half-written left */
	CHECK_EQ_INT(mkimage("--tree root", &out), 2);
	CHECK(out && strstr(out, "usage"));
	free(out);
	/* an archive cut short, or not one */
	REQUIRE(mkimage("--out img.cpio --tree root", NULL) == 0);
	snprintf(p, sizeof p, "%s/img.cpio", test_tmpdir());
	REQUIRE(truncate(p, 200) == 0);
	CHECK_EQ_INT(mkimage("--list img.cpio", &out), 1);
	CHECK(out && strstr(out, "cut short before its trailer"));
	free(out);
	put("junk", "this is not an archive at all, not even close to one; padding padding padding "
		    "padding padding padding padding padding padding");
	CHECK_EQ_INT(mkimage("--list junk", &out), 1);
	CHECK(out && strstr(out, "not a newc cpio archive"));
	free(out);
}
