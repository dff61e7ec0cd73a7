/*
 * mkimage.c — the appliance image: a directory tree packed as the kernel's initramfs (a cpio
 * archive in the "newc" format, uncompressed), reproducibly: entries in name order, owner root,
 * time 0 (or $SOURCE_DATE_EPOCH), inode numbers counted from 1. Device nodes, which a build
 * without root cannot create in the tree, are added by --nod.
 *
 *   mkimage --out dsv32.cpio --tree ROOT [--nod PATH:c|b:MAJOR:MINOR:MODE ...]
 *   mkimage --list dsv32.cpio      (every entry: mode, size, name; the format checked)
 *
 * Owns: the format, both ways. Must not: follow a symbolic link (it is stored as a link), store
 * anything but regular files, directories, links and the --nod nodes.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/mkimage/cpio.h"

struct out {
	FILE *f;
	const char *path;
	uint32_t ino;
	uint32_t mtime;
	uint64_t bytes;
};

/* The message, prefixed "mkimage: "; -1 */
__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "mkimage: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	return -1;
}

static void pad4(struct out *o)
{
	static const char zero[4];
	size_t n = (4 - o->bytes % 4) % 4;
	fwrite(zero, 1, n, o->f);
	o->bytes += n;
}

/* One entry's header and name (the data follows, then pad4) */
static void header(struct out *o, const char *name, uint32_t mode, uint64_t size,
		   uint32_t rmajor, uint32_t rminor)
{
	size_t nlen = strlen(name) + 1;
	fprintf(o->f, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08zX%08X", ++o->ino, mode,
		0u, 0u, S_ISDIR(mode) ? 2u : 1u, o->mtime, (uint32_t)size, 0u, 0u, rmajor, rminor,
		nlen, 0u);
	fwrite(name, 1, nlen, o->f);
	o->bytes += 110 + nlen;
	pad4(o);
}

static int copy_file(struct out *o, const char *src, uint64_t size)
{
	FILE *in = fopen(src, "rb");
	if (!in)
		return fail("%s: %s", src, strerror(errno));
	char buf[1 << 16];
	uint64_t left = size;
	while (left) {
		size_t n = fread(buf, 1, left < sizeof buf ? left : sizeof buf, in);
		if (!n) {
			fclose(in);
			return fail("%s: %s", src, "shorter than its size (changed while packed?)");
		}
		fwrite(buf, 1, n, o->f);
		left -= n;
	}
	fclose(in);
	o->bytes += size;
	pad4(o);
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* dir (on disk) packed as name (in the image; "" = the root, not itself an entry) */
static int pack_tree(struct out *o, const char *dir, const char *name)
{
	DIR *d = opendir(dir);
	if (!d)
		return fail("%s: %s", dir, strerror(errno));
	char **names = NULL;
	size_t n = 0;
	int r = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char **nn = realloc(names, (n + 1) * sizeof *nn);
		if (nn)
			names = nn;
		if (!nn || !(names[n] = strdup(e->d_name))) {
			r = fail("out of memory");
			break;
		}
		n++;
	}
	closedir(d);
	if (n && !r) /* (qsort takes no NULL, even for nothing) */
		qsort(names, n, sizeof *names, by_name);
	for (size_t i = 0; i < n && !r; i++) {
		char src[4096], dst[4096];
		struct stat st;
		if ((size_t)snprintf(src, sizeof src, "%s/%s", dir, names[i]) >= sizeof src ||
		    (size_t)snprintf(dst, sizeof dst, "%s%s%s", name, *name ? "/" : "", names[i]) >=
			    sizeof dst) {
			r = fail("%s/%s: %s", dir, names[i], "path longer than 4095 bytes");
		} else if (lstat(src, &st)) {
			r = fail("%s: %s", src, strerror(errno));
		} else if (S_ISDIR(st.st_mode)) {
			header(o, dst, S_IFDIR | (st.st_mode & 07777), 0, 0, 0);
			r = pack_tree(o, src, dst);
		} else if (S_ISREG(st.st_mode)) {
			if ((uint64_t)st.st_size > UINT32_MAX)
				r = fail("%s: %s", src, "larger than the format's 4 GiB");
			else {
				header(o, dst, S_IFREG | (st.st_mode & 07777), (uint64_t)st.st_size, 0, 0);
				r = copy_file(o, src, (uint64_t)st.st_size);
			}
		} else if (S_ISLNK(st.st_mode)) {
			char target[4096];
			ssize_t len = readlink(src, target, sizeof target);
			if (len < 0 || len == (ssize_t)sizeof target) {
				r = fail("%s: %s", src, "unreadable link");
			} else {
				header(o, dst, S_IFLNK | 0777, (uint64_t)len, 0, 0);
				fwrite(target, 1, (size_t)len, o->f);
				o->bytes += (uint64_t)len;
				pad4(o);
			}
		} else {
			r = fail("%s: %s", src, "not a file, directory or link (use --nod for devices)");
		}
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return r;
}

/* PATH:c|b:MAJOR:MINOR:MODE */
static int pack_nod(struct out *o, const char *tree, const char *spec)
{
	char path[256], type;
	unsigned maj, min, mode;
	int used = 0;
	if (sscanf(spec, "%255[^:]:%c:%u:%u:%o%n", path, &type, &maj, &min, &mode, &used) != 5 ||
	    spec[used] || (type != 'c' && type != 'b') || mode > 07777)
		return fail("--nod %s: %s", spec, "expected PATH:c|b:MAJOR:MINOR:MODE (octal)");
	const char *name = path[0] == '/' ? path + 1 : path;
	/* its directory must be in the tree (the kernel creates no missing directories) */
	char dir[4352];
	struct stat st;
	snprintf(dir, sizeof dir, "%s/%s", tree, name);
	*strrchr(dir, '/') = 0;
	if (stat(dir, &st) || !S_ISDIR(st.st_mode))
		return fail("--nod %s: %s", spec, "its directory is not in the tree");
	header(o, name, (type == 'c' ? S_IFCHR : S_IFBLK) | mode, 0, maj, min);
	return 0;
}

static int print_entry(void *ctx, const struct cpio_entry *e)
{
	(void)ctx;
	printf("%06o %10u %s", e->mode, e->size, e->name);
	if (S_ISCHR(e->mode) || S_ISBLK(e->mode))
		printf(" (%u, %u)", e->rmajor, e->rminor);
	printf("\n");
	return 0;
}

static int list(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st))
		return fail("%s: %s", path, strerror(errno));
	const char *why = NULL;
	void *p = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
	close(fd);
	if (p == MAP_FAILED)
		return fail("%s: %s", path, strerror(errno));
	int r = cpio_walk(p, (size_t)st.st_size, print_entry, NULL, &why);
	if (p)
		munmap(p, (size_t)st.st_size);
	return r ? fail("%s: %s", path, why) : 0;
}

int main(int argc, char **argv)
{
	const char *out = NULL, *tree = NULL;
	if (argc == 3 && !strcmp(argv[1], "--list"))
		return list(argv[2]) ? 1 : 0;
	const char **nods = calloc((size_t)argc, sizeof *nods); /* the --nod specs, in order */
	int n_nods = 0, usage = !nods;
	for (int i = 1; i < argc && !usage; i++) {
		if (i + 1 < argc && !strcmp(argv[i], "--out"))
			out = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--tree"))
			tree = argv[++i];
		else if (i + 1 < argc && !strcmp(argv[i], "--nod"))
			nods[n_nods++] = argv[++i];
		else
			usage = 1;
	}
	if (usage || !out || !tree) {
		fprintf(stderr, "usage: mkimage --out FILE --tree DIR [--nod PATH:c|b:MAJOR:MINOR:MODE ...]\n"
				"       mkimage --list FILE\n");
		free(nods);
		return 2;
	}
	struct out o = {.path = out};
	const char *epoch = getenv("SOURCE_DATE_EPOCH");
	o.mtime = epoch ? (uint32_t)strtoul(epoch, NULL, 10) : 0;
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp", out);
	int r = (o.f = fopen(tmp, "wb")) ? pack_tree(&o, tree, "") : fail("%s: %s", tmp, strerror(errno));
	for (int i = 0; i < n_nods && !r; i++)
		r = pack_nod(&o, tree, nods[i]);
	free(nods);
	if (!o.f)
		return 1;
	if (!r) {
		header(&o, "TRAILER!!!", 0, 0, 0, 0);
		static const char zero[512]; /* (pad to a 512-byte block, as cpio(1) does) */
		fwrite(zero, 1, (512 - o.bytes % 512) % 512, o.f);
	}
	if (fclose(o.f) && !r)
		r = fail("%s: %s", tmp, strerror(errno));
	if (!r && rename(tmp, out))
		r = fail("%s: %s", out, strerror(errno));
	if (r) {
		unlink(tmp);
		return 1;
	}
	printf("mkimage: %s: %u entries, %llu bytes\n", out, o.ino,
	       (unsigned long long)o.bytes);
	return 0;
}
