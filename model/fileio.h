/*
 * fileio.h — small whole-file helpers shared by the loaders and tools.
 */
#ifndef DSV32_FILEIO_H
#define DSV32_FILEIO_H

#include <stddef.h>

#include "model/err.h"

/* Reads a whole regular file (at most max bytes) into a malloc'd, NUL-terminated buffer.
 * Returns NULL with e naming the path and the reason. */
char *file_read(const char *path, size_t *len, size_t max, struct err *e);
/* The whole of a file whose size stat(2) does not tell (/proc files, a pipe), up to max bytes
 * (the rest is not read), into a malloc'd NUL-terminated buffer; NULL with e naming the path. */
char *file_read_stream(const char *path, size_t max, struct err *e);
/* Writes n bytes to path (created or truncated, mode 0644). 0 or -errno with e set. */
int file_write(const char *path, const void *p, size_t n, struct err *e);
/* mkdir -p: dir and every missing directory above it (mode 0755). 0 (also when it exists), or
 * -errno of the last mkdir. */
int dir_make(const char *dir);
/* path_join(buf, size, dir, name) -> "dir/name"; returns buf. */
char *path_join(char *buf, size_t size, const char *dir, const char *name);

#endif
