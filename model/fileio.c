/*
 * fileio.c — whole-file read/write with errors that name the path.
 */
#include "model/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *file_read(const char *path, size_t *len, size_t max, struct err *e)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err_set(e, -errno, "%s: cannot open: %s", path, strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		err_set(e, -EINVAL, "%s: not a regular file", path);
		close(fd);
		return NULL;
	}
	if ((size_t)st.st_size > max) {
		err_set(e, -EFBIG, "%s: %lld bytes exceeds the limit of %zu", path,
			(long long)st.st_size, max);
		close(fd);
		return NULL;
	}
	size_t n = (size_t)st.st_size, got = 0;
	char *buf = malloc(n + 1);
	if (!buf) {
		err_set(e, -ENOMEM, "%s: out of memory", path);
		close(fd);
		return NULL;
	}
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			err_set(e, r < 0 ? -errno : -EIO, "%s: read failed: %s", path,
				r < 0 ? strerror(errno) : "file shrank while reading");
			free(buf);
			close(fd);
			return NULL;
		}
		got += (size_t)r;
	}
	close(fd);
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

char *file_read_stream(const char *path, size_t max, struct err *e)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *buf = fd >= 0 ? malloc(max + 1) : NULL;
	size_t got = 0;
	ssize_t r = 1;
	while (buf && got < max && (r = read(fd, buf + got, max - got)) != 0)
		if (r > 0)
			got += (size_t)r;
		else if (errno != EINTR)
			break;
	if (fd < 0 || !buf || r < 0) {
		err_set(e, fd < 0 || r < 0 ? -errno : -ENOMEM, "%s: %s", path,
			fd < 0 || r < 0 ? strerror(errno) : "out of memory");
		free(buf);
		buf = NULL;
	} else {
		buf[got] = 0;
	}
	if (fd >= 0)
		close(fd);
	return buf;
}

int file_write(const char *path, const void *p, size_t n, struct err *e)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return err_set(e, -errno, "%s: cannot create: %s", path, strerror(errno));
	const char *c = p;
	while (n) {
		ssize_t r = write(fd, c, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int code = -errno;
			close(fd);
			return err_set(e, code, "%s: write failed: %s", path, strerror(-code));
		}
		c += r;
		n -= (size_t)r;
	}
	if (close(fd))
		return err_set(e, -errno, "%s: close failed: %s", path, strerror(errno));
	return 0;
}

char *path_join(char *buf, size_t size, const char *dir, const char *name)
{
	size_t n = strlen(dir);
	snprintf(buf, size, "%s%s%s", dir, n && dir[n - 1] == '/' ? "" : "/", name);
	return buf;
}

int dir_make(const char *dir)
{
	char buf[4096];
	if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
		return -ENAMETOOLONG;
	for (char *p = buf + 1; *p; p++)
		if (*p == '/') {
			*p = 0;
			mkdir(buf, 0755); /* (an existing one, or a failure the last mkdir reports) */
			*p = '/';
		}
	return mkdir(buf, 0755) && errno != EEXIST ? -errno : 0;
}
